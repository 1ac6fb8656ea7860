//! A P4Runtime target registered with TLS options reaches a switch that
//! requires mutual TLS (certificates made here by rcgen, the switch's
//! issued for a name that is not the dialed address), and its status
//! reports the port counters the switch's program kept: per subscription
//! port, exactly the packets and bytes the reference interpreter delivers.
//! A registration with a certificate but no key is refused.

mod common;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
use std::collections::BTreeMap;
use std::sync::Arc;
use subc_lang::Interpreter;
use subc_p4runtime::testing::{Checks, ServerTls, TestServer, DEVICE};
use subc_server::proto::{self, register_target_request::Kind};

fn ca() -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.distinguished_name.push(DnType::CommonName, "subc test CA");
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

/// A certificate for `name` with `purpose`, and its key, in PEM.
fn issue(ca: &CertifiedIssuer<'static, KeyPair>, name: &str, purpose: ExtendedKeyUsagePurpose) -> (String, String) {
    let mut p = CertificateParams::new(vec![name.to_string()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.extended_key_usages = vec![purpose];
    let key = KeyPair::generate().unwrap();
    (p.signed_by(&key, ca).unwrap().pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_p4runtime_target_over_mutual_tls_reports_its_port_counters() {
    bounded(120, async {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca();
        let (switch_cert, switch_key) = issue(&ca, "switch.test", ExtendedKeyUsagePurpose::ServerAuth);
        let (client_cert, client_key) = issue(&ca, "subc", ExtendedKeyUsagePurpose::ClientAuth);
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p.to_str().unwrap().to_string()
        };
        let (ca_file, cert_file, key_file) = (write("ca.pem", &ca.pem()), write("subc.pem", &client_cert), write("subc.key", &client_key));
        let spec_text = std::fs::read_to_string(repo().join("examples/itch/itch.spec")).unwrap();
        let spec = subc_workload::programs::check(&spec_text, &[]).unwrap().spec;
        let tls = ServerTls { cert: switch_cert.into_bytes(), key: switch_key.into_bytes(), client_ca: Some(ca.pem().into_bytes()) };
        let switch = TestServer::start_tls(Checks::Recover(Arc::new(spec.clone())), tls).await.unwrap();

        let env = Env::new().await;
        let mut admin = env.admin.clone();
        let tls = proto::P4RuntimeTls {
            ca_cert_file: ca_file,
            client_cert_file: cert_file.clone(),
            client_key_file: key_file,
            server_name: "switch.test".into(),
        };
        let ports: std::collections::HashMap<u32, u32> = (0..16).map(|p| (p, p + 20)).collect();
        let target = |tls: proto::P4RuntimeTls| proto::RegisterTargetRequest {
            name: "sw".into(),
            kind: Some(Kind::P4runtime(proto::P4RuntimeTarget {
                address: switch.addr.trim_start_matches("http://").into(),
                device_id: DEVICE,
                ports: ports.clone(),
                device_config: b"{}".to_vec(),
                election_id: 3,
                tls: Some(tls),
                ..Default::default()
            })),
            manual: false,
        };
        let half = proto::P4RuntimeTls { client_key_file: String::new(), ..tls.clone() };
        let refused = admin.targets.register(target(half)).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains("a client certificate needs its key"), "{refused:?}");
        admin.targets.register(target(tls)).await.unwrap();

        let rules = ["stock == GOOGL : fwd(1)", "stock == MSFT && shares > 50 : fwd(2)", "shares > 900 : fwd(1, 3)"];
        env.alice.clone().subs.add(proto::AddRequest { lines: rules.map(String::from).to_vec(), ..Default::default() }).await.unwrap();
        let deployed = admin.targets.deploy(proto::DeployRequest { name: "sw".into(), timeout_ms: 30_000 }).await.unwrap().into_inner();
        assert_eq!(deployed.status.unwrap().state(), proto::TargetState::InSync);

        // Packets through the switch's program; the interpreter says where they go.
        let p = subc_workload::programs::check(&spec_text, &[&rules.join("\n")]).unwrap();
        let gen = subc_workload::PacketGen::new(&p.spec, &p.normal_forms);
        let mut rng = subc_workload::Rng::new(11);
        let packets: Vec<(Vec<u8>, u64)> = (0..400u64).map(|i| (gen.packet(&mut rng, 0.05), 1_000_000_000 + i * 1000)).collect();
        switch.send(&p.spec, &packets).unwrap();
        let mut reference = Interpreter::new(&p.spec, &p.subscriptions);
        let mut want: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for (bytes, ts) in &packets {
            for port in reference.run(bytes, *ts).ports {
                let w = want.entry(port).or_default();
                *w = (w.0 + 1, w.1 + bytes.len() as u64);
            }
        }
        assert!(want.len() >= 2, "the packets reach several ports: {want:?}");
        let status = admin.targets.status(proto::TargetRequest { name: "sw".into() }).await.unwrap().into_inner();
        let got: BTreeMap<u32, (u64, u64)> = status.port_counters.iter().map(|c| (c.port, (c.packets, c.bytes))).collect();
        assert_eq!(got, want, "per subscription port, the switch counted what the interpreter delivers");
        env.stop().await;
    })
    .await;
}
