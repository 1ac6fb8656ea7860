//! The canonical protobuf JSON of the API's messages, and times.
//!
//! Every `subc ... --json` that prints an API message prints it in the
//! proto3 JSON mapping, exactly as `grpcurl` does: lowerCamelCase names,
//! enums by name, 64-bit integers as strings, `Timestamp` in RFC 3339. Unlike
//! the mapping's default, fields at their default value are printed too, so
//! that a script finds every key on every object (grpcurl's
//! `-emit-defaults`). The printer reads the descriptors, so a field added to
//! the proto appears without code here.

use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};
use std::sync::OnceLock;

fn pool() -> &'static DescriptorPool {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(crate::proto::FILE_DESCRIPTOR_SET).expect("the build's own descriptor set decodes"))
}

/// `m` in the canonical protobuf JSON mapping, default values included.
pub fn to_json<M: prost::Message + prost::Name>(m: &M) -> serde_json::Value {
    let desc = pool().get_message_by_name(&M::full_name()).expect("every API message is in the descriptor set");
    let dynamic = DynamicMessage::decode(desc, m.encode_to_vec().as_slice()).expect("a message decodes as its own type");
    let options = SerializeOptions::new().skip_default_fields(false);
    dynamic.serialize_with_options(serde_json::value::Serializer, &options).expect("a message serializes to JSON")
}

/// The largest integer every smaller one of which a double holds exactly.
const MAX_EXACT: u64 = 1 << 53;

/// A JSON object as a `google.protobuf.Struct` (anything else becomes
/// `{"value": ...}`). Numbers become doubles, as in `Struct` itself, except
/// integers a double cannot hold exactly (beyond 2^53, such as 64-bit match
/// keys), which become strings of digits, as `uint64` does in protobuf JSON.
pub fn to_struct(v: serde_json::Value) -> prost_types::Struct {
    fn value(v: serde_json::Value) -> prost_types::Value {
        use prost_types::value::Kind;
        let kind = match v {
            serde_json::Value::Null => Kind::NullValue(0),
            serde_json::Value::Bool(b) => Kind::BoolValue(b),
            serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) if i.unsigned_abs() <= MAX_EXACT => Kind::NumberValue(i as f64),
                (None, Some(u), _) if u <= MAX_EXACT => Kind::NumberValue(u as f64),
                (Some(_), _, _) | (None, Some(_), _) => Kind::StringValue(n.to_string()),
                (None, None, f) => Kind::NumberValue(f.unwrap_or_default()),
            },
            serde_json::Value::String(s) => Kind::StringValue(s),
            serde_json::Value::Array(a) => Kind::ListValue(prost_types::ListValue { values: a.into_iter().map(value).collect() }),
            o @ serde_json::Value::Object(_) => Kind::StructValue(to_struct(o)),
        };
        prost_types::Value { kind: Some(kind) }
    }
    match v {
        serde_json::Value::Object(m) => prost_types::Struct { fields: m.into_iter().map(|(k, v)| (k, value(v))).collect() },
        other => prost_types::Struct { fields: [("value".to_string(), value(other))].into() },
    }
}

/// A `google.protobuf.Struct` as the JSON object it stands for; whole
/// numbers print without a fraction.
pub fn from_struct(s: &prost_types::Struct) -> serde_json::Value {
    fn value(v: &prost_types::Value) -> serde_json::Value {
        use prost_types::value::Kind;
        match &v.kind {
            None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
            Some(Kind::BoolValue(b)) => (*b).into(),
            Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() <= MAX_EXACT as f64 => (*n as i64).into(),
            Some(Kind::NumberValue(n)) => (*n).into(),
            Some(Kind::StringValue(s)) => s.clone().into(),
            Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
            Some(Kind::StructValue(s)) => from_struct(s),
        }
    }
    s.fields.iter().map(|(k, v)| (k.clone(), value(v))).collect::<serde_json::Map<_, _>>().into()
}

/// Milliseconds since the Unix epoch as a `Timestamp`.
pub fn timestamp(unix_ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds: unix_ms.div_euclid(1000), nanos: (unix_ms.rem_euclid(1000) * 1_000_000) as i32 }
}

/// A `Timestamp` (none: 0) as milliseconds since the Unix epoch.
pub fn unix_ms(t: Option<&prost_types::Timestamp>) -> i64 {
    t.map_or(0, |t| t.seconds * 1000 + i64::from(t.nanos) / 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto;

    #[test]
    fn messages_print_in_the_canonical_mapping() {
        let s = proto::Subscription {
            id: 7,
            app: "alice".into(),
            text: "a == 1 : fwd(1)".into(),
            generation: 3,
            create_time: Some(timestamp(1_700_000_000_123)),
        };
        assert_eq!(
            to_json(&s),
            serde_json::json!({"id": "7", "app": "alice", "text": "a == 1 : fwd(1)", "generation": "3", "createTime": "2023-11-14T22:13:20.123Z"})
        );
        let st = proto::TargetStatus { state: proto::TargetState::InSync as i32, ..Default::default() };
        let v = to_json(&st);
        assert_eq!(v["state"], "TARGET_STATE_IN_SYNC");
        assert_eq!(v["portCounters"], serde_json::json!([]), "defaults are printed: {v}");
    }

    #[test]
    fn structs_round_trip() {
        let v = serde_json::json!({"op": "insert", "pipeline": 2, "ratio": 0.5, "keys": [1, "a", null, true], "inner": {"x": -3}});
        assert_eq!(from_struct(&to_struct(v.clone())), v);
        // A 64-bit key survives, as a string of digits.
        let big = serde_json::json!({"value": 5788605791469783123u64, "low": -(1i64 << 60)});
        assert_eq!(from_struct(&to_struct(big)), serde_json::json!({"value": "5788605791469783123", "low": "-1152921504606846976"}));
    }

    #[test]
    fn times_round_trip() {
        for ms in [0, 1, 999, 1_700_000_000_123, -1, -1001] {
            assert_eq!(unix_ms(Some(&timestamp(ms))), ms);
        }
        assert_eq!(unix_ms(None), 0);
    }
}
