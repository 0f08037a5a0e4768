"""HTTP: routes, request and response models, server-sent events. No business rules."""
