//! Serving the agent: the API socket and the metrics + health endpoint.

pub mod metrics;
