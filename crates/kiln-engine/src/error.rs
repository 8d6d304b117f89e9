use kiln_models::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Backend(#[from] kiln_backend::BackendError),
    #[error("invalid sampling parameter: {0}")]
    Sampling(String),
    #[error("{0}")]
    Input(String),
    /// What a placement of the model cannot do (e.g. score on a split decoder).
    #[error("{0}")]
    Unsupported(String),
    /// Writing results out failed (a closed pipe, a full disk).
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
}
