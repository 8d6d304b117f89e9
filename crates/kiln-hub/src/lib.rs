//! kiln-hub: kiln: fetching and verifying model files into the local cache
