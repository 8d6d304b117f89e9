//! kiln-backend: kiln: the Backend trait, Linear<B> and op parameters
