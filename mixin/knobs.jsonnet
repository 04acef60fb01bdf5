// The knobs and their defaults (config.libsonnet), as rules/render.py --list prints them.
(import 'config.libsonnet')._config
