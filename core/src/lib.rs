//! Spillway core: record model, config, converters, transforms, connector traits.
