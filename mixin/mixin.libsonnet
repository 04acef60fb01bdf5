// The vllm-xpu-exporter monitoring mixin: its recording rules (prometheusRules), alerts (prometheusAlerts)
// and Grafana dashboard (grafanaDashboards), with the knobs of config.libsonnet in `_config`. The shipped
// rules/vllm-xpu-exporter.yaml and grafana/vllm-xpu-exporter.json are this mixin with the default knobs
// (rules.jsonnet and dashboard.jsonnet write them). docs/alerts-and-dashboard.md.
local template = import 'lib/template.libsonnet';

(import 'config.libsonnet') + {
  // The rules file as Prometheus loads it: rules.yaml with the knobs.
  rulesFile:: template.render(template.withoutNotes(importstr 'rules.yaml'), $._config, strict=true),

  local groups = std.parseYaml($.rulesFile).groups,
  local holding(kind) = [group for group in groups if std.all([std.objectHas(rule, kind) for rule in group.rules])],
  prometheusRules+:: { groups+: holding('record') },
  prometheusAlerts+:: { groups+: holding('alert') },

  // dashboard.json (written by grafana/dashboard.py from its panel list) with the knobs.
  local multiCluster = template.text($._config.showMultiCluster) == 'true',
  local dashboard = template.renderAll(import 'dashboard.json', $._config),
  grafanaDashboards+:: {
    'vllm-xpu-exporter.json': dashboard {
      templating+: {
        list: [
          if variable.name == 'cluster' && !multiCluster then variable { hide: 2 } else variable
          for variable in super.list
        ],
      },
    },
  },
}
