//! What every layer of the process shares: its configuration, long jobs a retry joins,
//! the handlers' guards, the state directory, and the test-only kill points.

pub mod config;
pub mod faults;
pub mod jobs;
pub mod locks;
pub mod state_dir;
