// The templates' ${knob} placeholders: ${name} is the knob's value, ${name:seconds} a duration knob in
// seconds, ${name%anchor} a pattern knob with its %s as anchor. A placeholder naming no knob (Grafana's own
// ${datasource}) is left as it is, unless `strict`.
local durationUnits = { ms: 0.001, s: 1, m: 60, h: 3600, d: 86400, w: 604800, y: 31536000 };
local digits = std.set(std.stringChars('0123456789'));

{
  // A Prometheus duration ("1h30m") in seconds.
  durationSeconds(duration)::
    local close(state) =
      assert std.objectHas(durationUnits, state.unit) && state.count != '' : 'not a Prometheus duration: %s' % duration;
      std.parseInt(state.count) * durationUnits[state.unit];
    local parsed = std.foldl(function(state, char)
      if std.setMember(char, digits) && state.unit != '' then
        { total: state.total + close(state), count: char, unit: '' }
      else if std.setMember(char, digits) then state { count: state.count + char }
      else state { unit: state.unit + char }, std.stringChars(duration), { total: 0, count: '', unit: '' });
    parsed.total + close(parsed),

  // A knob's value as the templates write it: strings as they are, numbers and booleans as JSON does.
  text(value)::
    if std.isString(value) then value
    else if std.isNumber(value) && value == std.floor(value) then '%d' % value
    else std.manifestJson(value),

  // `text` with each placeholder replaced by its knob from `config`.
  render(text, config, strict=false)::
    local knob(spec) =
      local seconds = std.endsWith(spec, ':seconds');
      local pattern = std.splitLimit(spec, '%', 1);
      local name = if seconds then spec[:std.length(spec) - 8] else pattern[0];
      if !std.objectHas(config, name) then
        assert !strict : 'the template uses a knob without a default: %s' % name;
        '${%s}' % spec
      else if seconds then $.text($.durationSeconds($.text(config[name])))
      else if std.length(pattern) == 2 then std.strReplace($.text(config[name]), '%s', pattern[1])
      else $.text(config[name]);
    local pieces = std.split(text, '${');
    pieces[0] + std.join('', [
      local parts = std.splitLimit(piece, '}', 1);
      if std.length(parts) == 1 then '${' + piece else knob(parts[0]) + parts[1]
      for piece in pieces[1:]
    ]),

  // The template's lines less its own notes (lines starting #%).
  withoutNotes(text)::
    std.join('\n', [line for line in std.split(text, '\n') if !std.startsWith(line, '#%')]),

  // Every string of `node` rendered (a dashboard's JSON).
  renderAll(node, config)::
    if std.isString(node) then $.render(node, config)
    else if std.isArray(node) then [$.renderAll(item, config) for item in node]
    else if std.isObject(node) then { [key]: $.renderAll(node[key], config) for key in std.objectFields(node) }
    else node,
}
