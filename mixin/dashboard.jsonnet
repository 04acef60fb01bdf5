// grafana/vllm-xpu-exporter.json: `jsonnet mixin/dashboard.jsonnet`, or with knobs
// `jsonnet --tla-code overrides='{clusterLabel: "k8s_cluster"}' mixin/dashboard.jsonnet`. `template`
// replaces dashboard.json (grafana/dashboard.py passes the panels it built with other thresholds).
function(overrides={}, template=null)
  local mixin = (import 'mixin.libsonnet') + { _config+:: overrides }
                + (if template == null then {} else { dashboardTemplate:: template });
  mixin.grafanaDashboards['vllm-xpu-exporter.json']
