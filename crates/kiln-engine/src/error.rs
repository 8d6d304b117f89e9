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
}
