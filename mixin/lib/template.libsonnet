// The templates' ${knob} placeholders: ${name} is the knob's value, ${name%anchor} a pattern knob with its %s
// as anchor, and ${name:form} the knob in another form: `seconds` and `words` (a duration: 900, "15 minutes"),
// `percent` (a ratio: "5 %"), `bytes` ("512 MiB"), `list` (values joined by |: "thermal, psu"), `number`
// and `doubledRatio` (twice a ratio, at most 1). A string that is only a `number` or `doubledRatio`
// placeholder becomes that number (a dashboard's threshold). A placeholder naming no knob (Grafana's own
// ${datasource}) is left as it is, unless `strict`.
local durationUnits = { ms: 0.001, s: 1, m: 60, h: 3600, d: 86400, w: 604800, y: 31536000 };
local digits = std.set(std.stringChars('0123456789'));
local numeric = ['number', 'doubledRatio'];

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

  // A duration in words, in its largest whole unit: "15m" -> "15 minutes", "1h30m" -> "90 minutes".
  durationWords(duration)::
    local seconds = $.durationSeconds(duration);
    local whole = [unit for unit in [[86400, 'day'], [3600, 'hour'], [60, 'minute'], [1, 'second']]
                   if seconds >= unit[0] && std.mod(seconds, unit[0]) == 0];
    if whole == [] then '%g seconds' % seconds
    else local count = seconds / whole[0][0]; '%d %s%s' % [count, whole[0][1], if count == 1 then '' else 's'],

  // A number of bytes in binary units: 1073741824 -> "1 GiB".
  bytesText(count)::
    local step(units, value) =
      if std.abs(value) < 1024 || std.length(units) == 1 then '%g %s' % [value, units[0]]
      else step(units[1:], value / 1024);
    step(['B', 'KiB', 'MiB', 'GiB', 'TiB'], count),

  // A knob's value as the templates write it: strings as they are, numbers at their shortest (0.1, not
  // 0.10000000000000001), booleans as JSON does.
  text(value)::
    if std.isString(value) then value
    else if std.isNumber(value) && value == std.floor(value) then '%d' % value
    else if std.isNumber(value) then '%.15g' % value
    else std.manifestJson(value),

  local number(value) = std.parseJson($.text(value)),

  // The knob `name` of `config` in this form ('' for the value as it is).
  form(config, name, form)::
    local value = config[name];
    if form == '' then $.text(value)
    else if form == 'seconds' then $.text($.durationSeconds($.text(value)))
    else if form == 'words' then $.durationWords($.text(value))
    else if form == 'percent' then '%g %%' % (number(value) * 100)
    else if form == 'bytes' then $.bytesText(number(value))
    else if form == 'list' then std.strReplace($.text(value), '|', ', ')
    else if form == 'number' then number(value)
    else if form == 'doubledRatio' then std.min(2 * number(value), 1)
    else error 'unknown placeholder form %s of the knob %s' % [form, name],

  // `text` with each placeholder replaced by its knob from `config`.
  render(text, config, strict=false)::
    local knob(spec) =
      local formed = std.splitLimit(spec, ':', 1);
      local pattern = std.splitLimit(formed[0], '%', 1);
      local name = pattern[0];
      if !std.objectHas(config, name) then
        assert !strict : 'the template uses a knob without a default: %s' % name;
        '${%s}' % spec
      else if std.length(pattern) == 2 then std.strReplace($.text(config[name]), '%s', pattern[1])
      else local value = $.form(config, name, if std.length(formed) == 2 then formed[1] else '');
        if std.isString(value) then value else $.text(value);
    local pieces = std.split(text, '${');
    pieces[0] + std.join('', [
      local parts = std.splitLimit(piece, '}', 1);
      if std.length(parts) == 1 then '${' + piece else knob(parts[0]) + parts[1]
      for piece in pieces[1:]
    ]),

  // The template's lines less its own notes (lines starting #%).
  withoutNotes(text)::
    std.join('\n', [line for line in std.split(text, '\n') if !std.startsWith(line, '#%')]),

  // `node` (a dashboard's JSON) with every string rendered; a string that is one numeric placeholder is
  // its number.
  renderAll(node, config)::
    if std.isString(node) then
      local formed = std.splitLimit(node, ':', 1);
      if std.startsWith(node, '${') && std.endsWith(node, '}') && std.length(std.split(node, '$')) == 2
         && std.length(formed) == 2 && std.member(numeric, formed[1][:std.length(formed[1]) - 1])
      then $.form(config, formed[0][2:], formed[1][:std.length(formed[1]) - 1])
      else $.render(node, config)
    else if std.isArray(node) then [$.renderAll(item, config) for item in node]
    else if std.isObject(node) then { [key]: $.renderAll(node[key], config) for key in std.objectFields(node) }
    else node,
}
