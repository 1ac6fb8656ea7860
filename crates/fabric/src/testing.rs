//! Helpers for the tests of label-mode data planes (feature `testing`):
//! the references a fabric's deliveries are held to, shared by the eBPF
//! fabric on real kernels and the P4 simulator.

use crate::labels::LabelTables;
use crate::sim::{Delivery, LabelSimulator};
use crate::topology::{EndpointId, Topology};
use subc_lang::{Interpreter, Program};

/// What a label-mode fabric must deliver: per ingress device the
/// interpreter, run on the packets entering there (its state carrying on),
/// and the label simulator, which must agree with it.
pub struct LabelOracle<'a> {
    topology: &'a Topology,
    ingress: Vec<Interpreter<'a>>,
    /// One interpreter over every publisher's frames: where it decides
    /// otherwise than the ingress's, state kept per ingress mattered.
    global: Interpreter<'a>,
    /// Frames whose fate depended on state kept per ingress: a test whose
    /// count stays 0 could not tell one state per ingress from one state.
    pub state_mattered: usize,
    pub sim: LabelSimulator<'a>,
}

impl<'a> LabelOracle<'a> {
    pub fn new(topology: &'a Topology, program: &'a Program, tables: LabelTables) -> LabelOracle<'a> {
        LabelOracle {
            topology,
            ingress: topology.devices.iter().map(|_| Interpreter::new(&program.spec, &program.subscriptions)).collect(),
            global: Interpreter::new(&program.spec, &program.subscriptions),
            state_mattered: 0,
            sim: LabelSimulator::new(topology, tables, program),
        }
    }

    /// One frame from `publisher` at `ts_ns`: per endpoint whether it must
    /// receive the frame (what the interpreter on the publisher's ingress
    /// stream decides, the publisher left out), and the label simulator's
    /// delivery. Panics where the simulator delivers otherwise.
    pub fn send(&mut self, publisher: EndpointId, frame: &[u8], ts_ns: u64) -> (Vec<bool>, Delivery) {
        let device = self.topology.endpoints[publisher].at.device;
        let decided = self.ingress[device].run(frame, ts_ns).ports;
        self.state_mattered += usize::from(self.global.run(frame, ts_ns).ports != decided);
        let d = self.sim.send(publisher, frame, ts_ns);
        let wanted: Vec<bool> = (0..self.topology.endpoints.len()).map(|e| e != publisher && decided.contains(&(e as u32))).collect();
        for (e, (want, copies)) in wanted.iter().zip(&d.copies).enumerate() {
            assert_eq!(*copies, u32::from(*want), "the label simulator and the interpreter disagree on endpoint {e}");
        }
        (wanted, d)
    }
}
