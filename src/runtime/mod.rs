//! What every layer of the process shares: its configuration, calls that overlap (the
//! handlers' guards, long jobs a retry joins), the state directory, and the test-only
//! kill points.

pub mod config;
pub mod faults;
pub mod overlap;
pub mod parallel;
pub mod state_dir;
