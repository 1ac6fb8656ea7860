"""The generated protobuf messages and gRPC stubs of `subc.v1`
(proto/subc/v1/subc.proto); regenerate them with generate.py."""
