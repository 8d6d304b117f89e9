//! kiln-engine: kiln: generation, sampling, scoring
