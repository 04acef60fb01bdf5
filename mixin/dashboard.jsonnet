// grafana/vllm-xpu-exporter.json: `jsonnet mixin/dashboard.jsonnet`, or with knobs
// `jsonnet --tla-code overrides='{clusterLabel: "k8s_cluster"}' mixin/dashboard.jsonnet` (grafana/dashboard.py
// writes the result with two-space indentation).
function(overrides={})
  ((import 'mixin.libsonnet') + { _config+:: overrides }).grafanaDashboards['vllm-xpu-exporter.json']
