// rules/vllm-xpu-exporter.yaml: `jsonnet -S mixin/rules.jsonnet`, or with knobs
// `jsonnet -S --tla-code overrides='{selector: "job=\"gpu\""}' mixin/rules.jsonnet`.
function(overrides={}) ((import 'mixin.libsonnet') + { _config+:: overrides }).rulesFile
