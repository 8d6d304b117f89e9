//! The planner: which device runs what, and how fast it will go.
//!
//! [`ModelCost`] reads what a model costs from its file without loading it; [`Hardware`] says
//! what the machine offers (memory now, rates measured by [`probe`] and cached); [`plan`] lists
//! the placements that fit, predicts each one's speed and picks the fastest. The CLI turns the
//! chosen [`Placement`] into concrete backends (only it names them).

pub mod cost;
pub mod hardware;
pub mod plans;
pub mod probe;

pub use cost::{ModelCost, ModelShape, Place, ProductShape, TensorCost};
pub use hardware::{
    Device, DeviceKind, Hardware, ProfileCache, Rates, PROBE_ROWS, PROBE_STREAM_BYTES,
};
pub use plans::{
    plan, BackendChoice, Candidate, DeviceUse, Placement, Plan, PlanError, PlanRequest, Prediction,
    HEADROOM,
};
