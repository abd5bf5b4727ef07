//! Durable worker state (`StateStore` on sled). Not built yet: see the issue "Durable state".
