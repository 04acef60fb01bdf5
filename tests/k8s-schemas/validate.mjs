// Validates Prometheus Operator objects with @kubernetes-models/prometheus-operator (tests/deploy/test_kubernetes.py).
//
// stdin: a JSON list of objects (ServiceMonitor and PrometheusRule, monitoring.coreos.com/v1).
// stdout: a JSON list, one entry per object in the same order: {"kind", "name", "errors": [...]}, each error
// {"check", "path", "message"}; no errors means the object is valid. Exit status 0 if every object is valid,
// 1 if any is not, 2 if the input cannot be read or holds a kind this script has no model for.
//
// Two checks:
//  - "schema": the package's own validation, `new Model(object).validate()`, which throws on a wrong type, a
//    value out of its pattern or enum (durations) or a missing required field. Its schemas are generated from
//    the operator's Go types and carry no additionalProperties: this check passes a misspelt field.
//  - "fields": every field of an object the schema describes by its properties is one of those properties.
//    The package ships its schemas only as compiled validators, which read each property they know by name
//    (`data.honorLabels`, present or not) and enumerate the keys of maps (labels, annotations). The objects
//    are run through the model's validator a second time as proxies that record those reads: a key never read
//    in an object whose properties were read is a field the schema does not have. Objects the validator
//    neither reads by name nor enumerates (free-form ones, and anything under an unknown field) are not
//    looked into.
import { readFileSync } from "node:fs";

import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";

const MODELS = new Map([ServiceMonitor, PrometheusRule].map((model) => [`${model.apiVersion} ${model.kind}`, model]));

function schemaErrors(Model, object) {
  try {
    new Model(object).validate();
    return [];
  } catch (error) {
    if (!Array.isArray(error.errors)) throw error;
    return error.errors.map((e) => ({ check: "schema", path: e.instancePath, message: e.message }));
  }
}

// The object as proxies (arrays stay arrays of proxies), and one record per object: its keys and what was read.
function watched(value, path, records) {
  if (Array.isArray(value)) return value.map((item, index) => watched(item, `${path}/${index}`, records));
  if (value === null || typeof value !== "object") return value;
  const target = Object.fromEntries(Object.entries(value)
    .map(([key, item]) => [key, watched(item, `${path}/${key}`, records)]));
  const record = { path, keys: Object.keys(target), read: new Set(), enumerated: false };
  records.push(record);
  return new Proxy(target, {
    get(object, key, receiver) {
      if (typeof key === "string") record.read.add(key);
      return Reflect.get(object, key, receiver);
    },
    has(object, key) {
      if (typeof key === "string") record.read.add(key);
      return Reflect.has(object, key);
    },
    ownKeys(object) {
      record.enumerated = true;
      return Reflect.ownKeys(object);
    },
  });
}

function fieldErrors(Model, object) {
  const records = [];
  try {
    Model.prototype.validate.call(watched(object, "", records));
  } catch (error) {
    if (!Array.isArray(error.errors)) throw error; // the schema check reports these
  }
  const top = records.find((record) => record.path === "");
  if (!top || !top.read.has("spec") || !top.read.has("metadata")) {
    throw new Error(`${Model.kind}: the validator no longer reads the object's fields; the fields check cannot work`);
  }
  return records
    .filter((record) => !record.enumerated && record.read.size > 0)
    .flatMap((record) => record.keys.filter((key) => !record.read.has(key))
      .map((key) => ({ check: "fields", path: record.path, message: `has unknown field "${key}"` })));
}

function main() {
  let objects;
  try {
    objects = JSON.parse(readFileSync(0, "utf8"));
  } catch (error) {
    process.stderr.write(`validate.mjs: stdin is not JSON: ${error.message}\n`);
    return 2;
  }
  if (!Array.isArray(objects)) {
    process.stderr.write("validate.mjs: stdin is not a JSON list\n");
    return 2;
  }
  const results = [];
  for (const object of objects) {
    const Model = MODELS.get(`${object?.apiVersion} ${object?.kind}`);
    if (!Model) {
      const known = [...MODELS.keys()].join(", ");
      process.stderr.write(`validate.mjs: no model for ${object?.apiVersion} ${object?.kind}; it has ${known}\n`);
      return 2;
    }
    results.push({ kind: object.kind, name: object.metadata?.name ?? null,
                   errors: [...schemaErrors(Model, object), ...fieldErrors(Model, object)] });
  }
  process.stdout.write(JSON.stringify(results) + "\n");
  return results.every((result) => result.errors.length === 0) ? 0 : 1;
}

process.exitCode = main();
