//! libbpf's messages arrive as `tracing` events once routed, not on stderr.
//! (Opening an object that is not ELF makes libbpf complain; no privileges
//! are needed.)

use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn libbpf_messages_become_tracing_events() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber =
        tracing_subscriber::fmt().with_ansi(false).with_max_level(tracing::Level::DEBUG).with_writer(move || writer.clone()).finish();
    subc_ebpf_loader::log_libbpf_through_tracing();
    tracing::subscriber::with_default(subscriber, || {
        let opened = libbpf_rs::ObjectBuilder::default().open_memory(b"this is not an ELF object at all");
        assert!(opened.is_err());
    });
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("libbpf:") && text.contains("WARN"), "libbpf's complaint as a tracing event: {text:?}");
}
