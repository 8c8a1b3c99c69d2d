"""Development aids built offline: tiny models and data, the server launcher, the CPU harness
for verl's ``main_ppo`` and the demo. Used by tests, examples and benchmarks; never imported by
the plugin's normal path."""
