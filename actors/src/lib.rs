//! Actix actors that run a sink task (Supervisor, ConsumerActor, ConverterActor, SinkActor,
//! AckerActor). Not built yet: see the issue "Sink runtime".
