//! Built-in sink connectors (kafka, postgres, http, file). Not built yet: see the issues "Sink
//! runtime" and "Sinks for real systems".
