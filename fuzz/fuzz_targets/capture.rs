//! Fuzzes the capture reader: arbitrary bytes, read as a pcap or pcapng
//! file, give packets or an error, never a panic. A file that reads must
//! read the same after the classic writer wrote its packets back.

#![no_main]

use libfuzzer_sys::fuzz_target;
use subc_lang::{read_pcap, write_pcap};

fuzz_target!(|data: &[u8]| {
    if let Ok(packets) = read_pcap(data) {
        let again = read_pcap(&write_pcap(&packets)).expect("what the writer wrote reads");
        assert_eq!(again.len(), packets.len());
        for (a, p) in again.iter().zip(&packets) {
            assert_eq!((&a.data, a.orig_len), (&p.data, p.orig_len));
        }
    }
});
