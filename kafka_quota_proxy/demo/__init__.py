"""The demo, and the embedded tansu broker it (and tests, benches) runs. Imports proxy, config."""
