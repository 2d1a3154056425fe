"""HTTP adapters: one blueprint per resource. Routes parse, call the domain code, dump."""
