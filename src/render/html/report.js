// vramlens report: pickers, zoom and pan on the timeline, the stack panel. Everything the
// page shows is already in it; this script only shows, hides and moves it. It loads
// nothing (the page's Content-Security-Policy forbids it anyway).
(function () {
  'use strict';
  var doc = document;
  var seen = { errors: [], violations: [] };
  window.addEventListener('error', function (e) {
    seen.errors.push(String(e.message || e));
  });
  doc.addEventListener('securitypolicyviolation', function (e) {
    seen.violations.push(e.violatedDirective + ' ' + e.blockedURI);
  });
  doc.documentElement.classList.add('js');

  function all(sel, el) {
    return Array.prototype.slice.call((el || doc).querySelectorAll(sel));
  }

  // Pickers: buttons (or a select) with data-picker="G" choose which of the panes with
  // data-pane="G" is shown, by data-value.
  function choose(group, value) {
    all('[data-pane="' + group + '"]').forEach(function (p) {
      p.classList.toggle('js-hidden', p.getAttribute('data-value') !== value);
    });
    all('[data-picker="' + group + '"]').forEach(function (picker) {
      if (picker.tagName === 'SELECT') {
        picker.value = value;
      } else {
        all('button[data-value]', picker).forEach(function (b) {
          b.setAttribute('aria-pressed', String(b.getAttribute('data-value') === value));
        });
      }
    });
  }

  all('[data-picker]').forEach(function (picker) {
    var group = picker.getAttribute('data-picker');
    if (picker.tagName === 'SELECT') {
      picker.addEventListener('change', function () { choose(group, picker.value); });
      choose(group, picker.value);
    } else {
      picker.addEventListener('click', function (e) {
        var b = e.target.closest('button[data-value]');
        if (b) { choose(group, b.getAttribute('data-value')); }
      });
      var first = picker.querySelector('button[data-value]');
      if (first) { choose(group, first.getAttribute('data-value')); }
    }
  });
  // A row of the table of ranks shows its file (a link in it then scrolls there).
  all('[data-show-file]').forEach(function (el) {
    el.addEventListener('click', function () {
      choose('file', el.getAttribute('data-show-file'));
    });
  });

  // Zoom and pan of the time axis: each chart panel draws its bands, lines and marks in
  // a nested svg.plot; a zoom shows part of its x range there (lo..hi, fractions of the
  // whole), with the y axis, the legend and the sizes of text and marks unchanged, and
  // the x axis's ticks drawn anew for the part shown.
  function decimalStep(span, ticks) {
    var raw = Math.max(span / ticks, 1e-9);
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = [1, 2, 5, 10].filter(function (k) { return k * p >= raw; })[0];
    return (m || 10) * p;
  }
  function axisOf(plot) {
    var axes = Array.prototype.filter.call(plot.parentNode.children, function (el) {
      return el.classList && el.classList.contains('x-axis');
    });
    return axes[0] || null;
  }
  function relabel(axis, lo, hi) {
    var num = function (name) { return Number(axis.getAttribute('data-' + name)); };
    var min = num('x-min');
    var span = num('x-max') - min;
    var scale = num('scale');
    var left = num('left');
    var right = num('right');
    var y = num('y');
    var unit = axis.getAttribute('data-unit');
    var a = min + lo * span;
    var b = min + hi * span;
    var step = decimalStep((b - a) / scale, 8) * scale;
    var digits = Math.max(0, Math.min(6, -Math.floor(Math.log10(step / scale) + 1e-9)));
    while (axis.firstChild) { axis.removeChild(axis.firstChild); }
    // Counted with an integer and at most 64: a step below what a float tells apart at
    // that offset would never move a sum.
    var first = Math.ceil(a / step - 1e-9);
    var last = null;
    for (var k = 0; k < 64 && isFinite(first) && step > 0; k++) {
      var x = (first + k) * step;
      if (!(x <= b + step * 1e-9)) { break; }
      if (x === last) { continue; }
      last = x;
      var px = left + (x - a) / (b - a) * (right - left);
      var tick = doc.createElementNS(axis.namespaceURI, 'line');
      [['x1', px], ['x2', px], ['y1', y], ['y2', y + 5], ['stroke', '#333']].forEach(function (kv) {
        tick.setAttribute(kv[0], kv[1]);
      });
      axis.appendChild(tick);
      var label = doc.createElementNS(axis.namespaceURI, 'text');
      label.setAttribute('x', px);
      label.setAttribute('y', y + 18);
      label.setAttribute('text-anchor', 'middle');
      label.textContent = (x / scale).toFixed(digits) + (unit ? ' ' + unit : '');
      axis.appendChild(label);
    }
  }
  function showRange(plot, lo, hi) {
    var o = plot.vlOrigin;
    var w = Math.min(1, Math.max(1 / 256, hi - lo));
    lo = Math.min(1 - w, Math.max(0, lo));
    plot.vlRange = { lo: lo, hi: lo + w };
    plot.setAttribute('viewBox', [o.x + lo * o.w, o.y, w * o.w, o.h].map(function (n) {
      return Math.round(n * 1000) / 1000;
    }).join(' '));
    // Text and marks keep their width: each is scaled back about its own x.
    var k = 1 / w;
    all('text, .glyph', plot).forEach(function (el) {
      var x = Number(el.getAttribute(el.tagName === 'text' ? 'x' : 'data-x'));
      el.setAttribute('transform', k === 1 ? '' :
        'translate(' + x + ',0) scale(' + (1 / k) + ',1) translate(' + (-x) + ',0)');
    });
    var axis = axisOf(plot);
    if (axis) {
      if (!axis.vlOriginal) { axis.vlOriginal = axis.innerHTML; }
      if (k === 1) { axis.innerHTML = axis.vlOriginal; } else { relabel(axis, plot.vlRange.lo, plot.vlRange.hi); }
    }
  }
  function zoomAt(plot, factor, at) {
    var r = plot.vlRange;
    var w = Math.min(1, Math.max(1 / 256, (r.hi - r.lo) * factor));
    var f = r.lo + at * (r.hi - r.lo);
    showRange(plot, f - at * w, f - at * w + w);
  }
  // The panel of a chart under a point (by height), else its first.
  function plotAt(svg, clientY) {
    var plots = all('svg.plot', svg);
    return plots.filter(function (p) {
      var r = p.getBoundingClientRect();
      return clientY >= r.top && clientY <= r.bottom;
    })[0] || plots[0];
  }
  var drag = null;
  var dragged = false;
  all('.zoomable svg.plot').forEach(function (plot) {
    var v = plot.getAttribute('viewBox').split(/[\s,]+/).map(Number);
    plot.vlOrigin = { x: v[0], y: v[1], w: v[2], h: v[3] };
    plot.vlRange = { lo: 0, hi: 1 };
  });
  all('.zoomable > svg').forEach(function (svg) {
    svg.addEventListener('wheel', function (e) {
      // A plain wheel scrolls the page; with Ctrl, Shift or the command key it zooms.
      if (!(e.ctrlKey || e.shiftKey || e.metaKey)) { return; }
      var plot = plotAt(svg, e.clientY);
      if (!plot) { return; }
      e.preventDefault();
      var r = plot.getBoundingClientRect();
      var at = Math.min(1, Math.max(0, (e.clientX - r.left) / Math.max(1, r.width)));
      zoomAt(plot, Math.exp(Math.max(-5, Math.min(5, e.deltaY * 0.002))), at);
    }, { passive: false });
    svg.addEventListener('mousedown', function (e) {
      if (e.button !== 0) { return; }
      var plot = plotAt(svg, e.clientY);
      if (!plot) { return; }
      e.preventDefault();
      drag = { svg: svg, plot: plot, x: e.clientX, y: e.clientY, range: plot.vlRange };
      dragged = false;
    });
    svg.addEventListener('dblclick', function () {
      all('svg.plot', svg).forEach(function (plot) { showRange(plot, 0, 1); });
    });
  });
  window.addEventListener('mousemove', function (e) {
    if (!drag) { return; }
    var dx = e.clientX - drag.x;
    if (Math.abs(dx) + Math.abs(e.clientY - drag.y) > 3) { dragged = true; }
    if (!dragged) { return; }
    drag.svg.classList.add('dragging');
    var r = drag.plot.getBoundingClientRect();
    var w = drag.range.hi - drag.range.lo;
    var lo = drag.range.lo - dx / Math.max(1, r.width) * w;
    showRange(drag.plot, lo, lo + w);
  });
  window.addEventListener('mouseup', function () {
    if (drag) { drag.svg.classList.remove('dragging'); }
    drag = null;
  });
  all('[data-zoom]').forEach(function (button) {
    button.addEventListener('click', function () {
      var scope = doc.getElementById(button.getAttribute('data-scope'));
      all('.zoomable svg.plot', scope).forEach(function (plot) {
        var how = button.getAttribute('data-zoom');
        if (how === 'reset') {
          showRange(plot, 0, 1);
        } else {
          zoomAt(plot, how === 'in' ? 0.5 : 2, 0.5);
        }
      });
    });
  });

  // The panel: the whole text of what was clicked (a band's or block's tooltip, a flame
  // box with the frames under it, a table row's stack).
  var panel = doc.getElementById('panel');
  function show(title, body) {
    doc.getElementById('panel-title').textContent = title;
    doc.getElementById('panel-body').textContent = body;
    panel.classList.add('open');
  }
  doc.getElementById('panel-close').addEventListener('click', function () {
    panel.classList.remove('open');
  });
  doc.addEventListener('keydown', function (e) {
    if (e.key === 'Escape') { panel.classList.remove('open'); }
  });
  function titleOf(el) {
    for (var i = 0; i < el.children.length; i++) {
      if (el.children[i].tagName.toLowerCase() === 'title') { return el.children[i].textContent; }
    }
    return null;
  }
  function rectOf(g) {
    var r = g.querySelector('rect');
    return r && {
      x: parseFloat(r.getAttribute('x')),
      y: parseFloat(r.getAttribute('y')),
      w: parseFloat(r.getAttribute('width'))
    };
  }
  // The boxes under a flame box: on each lower row, the one overlapping it most.
  function flameStack(svg, g) {
    var me = rectOf(g);
    var rows = {};
    all('g', svg).forEach(function (other) {
      var r = rectOf(other);
      var t = titleOf(other);
      if (!r || t === null || !(r.y > me.y + 0.5)) { return; }
      var overlap = Math.min(r.x + r.w, me.x + me.w) - Math.max(r.x, me.x);
      if (overlap < me.w / 2) { return; }
      if (!rows[r.y] || rows[r.y].overlap < overlap) {
        rows[r.y] = { overlap: overlap, name: t.split('\n')[0] };
      }
    });
    return Object.keys(rows).map(Number).sort(function (a, b) { return b - a; })
      .map(function (y) { return rows[y].name; });
  }
  doc.addEventListener('click', function (e) {
    if (dragged) { dragged = false; return; }
    var row = e.target.closest('table.live tbody tr');
    if (row && !e.target.closest('summary')) {
      var list = row.querySelector('ol.frames');
      var frames = list ? all('li', list).map(function (li) { return li.textContent; }) : [];
      var figures = row.getAttribute('data-figures') || '';
      show(row.getAttribute('data-name') || '',
        figures + (list ? '\n\n' + list.getAttribute('data-caption') + ':\n' + frames.join('\n') : ''));
      return;
    }
    var chart = e.target.closest('.chart');
    if (!chart) { return; }
    var svg = chart.querySelector('svg');
    for (var n = e.target; n && n !== svg; n = n.parentNode) {
      var text = titleOf(n);
      if (text === null) { continue; }
      var lines = text.split('\n');
      var body = lines.slice(1).join('\n');
      if (chart.getAttribute('data-chart') === 'flame') {
        var under = flameStack(svg, n);
        if (under.length) {
          body += '\n\n' + chart.getAttribute('data-caption') + ':\n' + under.join('\n');
        }
      }
      var band = e.target.closest('[data-label]');
      var file = chart.closest('.file');
      if (band && file && chart.getAttribute('data-chart') === 'timeline') {
        var label = band.getAttribute('data-label');
        var stack = all('.stacks ol', file).filter(function (ol) {
          return ol.getAttribute('data-label') === label;
        })[0];
        if (stack) {
          body += '\n\n' + stack.getAttribute('data-caption') + ':\n' +
            all('li', stack).map(function (li) { return li.textContent; }).join('\n');
        }
      }
      show(lines[0], body);
      return;
    }
  });

  // With #selftest in the address, act as a reader would and write what happened into
  // the page, for tests that load it in a browser.
  function visible(el) { return el.getClientRects().length > 0; }
  function click(el) {
    el.dispatchEvent(new MouseEvent('click', { bubbles: true, cancelable: true, view: window }));
  }
  function panelState() {
    return {
      open: panel.classList.contains('open') && visible(panel),
      title: doc.getElementById('panel-title').textContent,
      body: doc.getElementById('panel-body').textContent
    };
  }
  function visibleValues(group) {
    return all('[data-pane="' + group + '"]').filter(visible).map(function (p) {
      return p.getAttribute('data-value');
    });
  }
  function selftest() {
    var out = { steps: {} };
    var file = all('.file').filter(visible)[0];
    out.files = all('.file').length;
    out.visibleFiles = visibleValues('file');
    var id = file.id;
    var svg = all('.zoomable svg', file).filter(visible)[0];
    if (svg) {
      var r = svg.getBoundingClientRect();
      var cx = r.left + r.width / 2;
      var cy = r.top + r.height / 2;
      var plot = all('svg.plot', svg)[0];
      var axis = axisOf(plot);
      var yLabels = function () {
        return Array.prototype.filter.call(svg.children, function (el) {
          return el.tagName === 'text' && Number(el.getAttribute('x')) < plot.vlOrigin.x;
        }).map(function (el) { return el.textContent; });
      };
      var ticks = function () {
        return all('text', axis).map(function (el) { return el.textContent; });
      };
      var state = function () {
        return { svg: svg.getAttribute('viewBox'), plot: plot.getAttribute('viewBox'),
          range: [plot.vlRange.lo, plot.vlRange.hi], ticks: ticks(), yLabels: yLabels(),
          legend: all('rect', svg).filter(function (el) { return !plot.contains(el); }).length };
      };
      var pr = plot.getBoundingClientRect();
      cx = pr.left + pr.width / 2;
      cy = pr.top + pr.height / 3;
      var z = { before: state() };
      var plain = new WheelEvent('wheel', { deltaY: -400, clientX: cx, clientY: cy, bubbles: true, cancelable: true });
      svg.dispatchEvent(plain);
      z.plainWheelScrolls = !plain.defaultPrevented && plot.getAttribute('viewBox') === z.before.plot;
      svg.dispatchEvent(new WheelEvent('wheel', { deltaY: -400, ctrlKey: true, clientX: cx, clientY: cy, bubbles: true, cancelable: true }));
      z.zoomed = state();
      svg.dispatchEvent(new MouseEvent('mousedown', { button: 0, clientX: cx, clientY: cy, bubbles: true }));
      window.dispatchEvent(new MouseEvent('mousemove', { clientX: cx + 120, clientY: cy, bubbles: true }));
      window.dispatchEvent(new MouseEvent('mouseup', { clientX: cx + 120, clientY: cy, bubbles: true }));
      dragged = false;
      z.panned = state();
      var reset = file.querySelector('[data-zoom="reset"]');
      if (reset) { click(reset); }
      z.reset = state();
      out.steps.zoom = z;
      var bands = all('polygon[data-label]', svg);
      bands.sort(function (a, b) {
        return Number(b.getAttribute('data-bytes')) - Number(a.getAttribute('data-bytes'));
      });
      if (bands.length) {
        click(bands[0]);
        out.steps.band = { label: bands[0].getAttribute('data-label'), bytes: bands[0].getAttribute('data-bytes'), panel: panelState() };
      }
    }
    var flame = all('.chart[data-chart="flame"]', file).filter(visible)[0];
    if (flame) {
      var boxes = all('g', flame.querySelector('svg')).filter(function (g) { return rectOf(g) && titleOf(g) !== null; });
      boxes.sort(function (a, b) { return rectOf(a).y - rectOf(b).y || rectOf(b).w - rectOf(a).w; });
      if (boxes.length) {
        click(boxes[0].querySelector('rect'));
        out.steps.flame = { box: titleOf(boxes[0]).split('\n')[0], panel: panelState() };
      }
    }
    var row = all('table.live tbody tr', file).filter(visible)[0];
    if (row) {
      click(row);
      out.steps.row = { name: row.getAttribute('data-name'), panel: panelState() };
    }
    var moments = all('[data-picker="' + id + '-moment"] button[data-value]');
    if (moments.length) {
      var last = moments[moments.length - 1];
      var shownBefore = visibleValues(id + '-moment');
      click(last);
      out.steps.moment = { before: shownBefore, chosen: last.getAttribute('data-value'), shown: visibleValues(id + '-moment') };
    }
    var views = all('[data-picker="' + id + '-view"] button[data-value]');
    if (views.length > 1) {
      var viewBefore = visibleValues(id + '-view');
      click(views[1]);
      out.steps.view = { before: viewBefore, chosen: views[1].getAttribute('data-value'), shown: visibleValues(id + '-view') };
    }
    var devices = all('[data-picker="' + id + '-device"] button[data-value]');
    if (devices.length > 1) {
      var devicesBefore = visibleValues(id + '-device');
      click(devices[1]);
      var pane = all('[data-pane="' + id + '-device"]').filter(visible)[0];
      out.steps.device = {
        before: devicesBefore,
        chosen: devices[1].getAttribute('data-value'),
        shown: visibleValues(id + '-device'),
        device: pane ? pane.getAttribute('data-device') : null,
        charts: pane ? all('.chart svg', pane).filter(visible).length : 0
      };
      click(devices[0]);
    }
    var files = doc.querySelector('select[data-picker="file"]');
    if (files && files.options.length > 1) {
      var value = files.options[files.options.length - 1].value;
      files.value = value;
      files.dispatchEvent(new Event('change', { bubbles: true }));
      out.steps.file = { chosen: value, shown: visibleValues('file') };
      var link = doc.querySelector('tr[data-show-file="0"] a');
      if (link) {
        click(link);
        out.steps.rankLink = { shown: visibleValues('file'), picker: files.value, hash: location.hash };
      }
    }
    out.errors = seen.errors;
    out.violations = seen.violations;
    out.resources = performance.getEntriesByType('resource').length;
    var result = doc.createElement('pre');
    result.id = 'selftest-result';
    result.textContent = JSON.stringify(out);
    doc.body.appendChild(result);
  }
  if (location.hash === '#selftest') {
    window.addEventListener('load', function () {
      try {
        selftest();
      } catch (err) {
        var failed = doc.createElement('pre');
        failed.id = 'selftest-result';
        failed.textContent = JSON.stringify({ failed: String(err && err.stack || err), errors: seen.errors });
        doc.body.appendChild(failed);
      }
    });
  }
}());
