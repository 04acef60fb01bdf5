// grafana/vllm-xpu-exporter.json: `jsonnet -S mixin/dashboard.jsonnet`, or with knobs
// `jsonnet -S --tla-code overrides='{clusterLabel: "k8s_cluster"}' mixin/dashboard.jsonnet`. `template`
// replaces dashboard.json (grafana/dashboard.py passes the panels it built with other thresholds).
function(overrides={}, template=null)
  local mixin = (import 'mixin.libsonnet') + { _config+:: overrides }
                + (if template == null then {} else { dashboardTemplate:: template });
  std.manifestJsonEx(mixin.grafanaDashboards['vllm-xpu-exporter.json'], '  ') + '\n'
