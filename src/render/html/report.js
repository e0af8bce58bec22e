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

  // Zoom and pan: the timeline's viewBox, kept inside the original picture.
  function box(svg) {
    var v = svg.getAttribute('viewBox').split(/[\s,]+/).map(Number);
    return { x: v[0], y: v[1], w: v[2], h: v[3] };
  }
  function setBox(svg, b) {
    var o = svg.vlOrigin;
    b.w = Math.min(o.w, Math.max(o.w / 64, b.w));
    b.h = b.w * o.h / o.w;
    b.x = Math.min(o.x + o.w - b.w, Math.max(o.x, b.x));
    b.y = Math.min(o.y + o.h - b.h, Math.max(o.y, b.y));
    svg.setAttribute('viewBox', [b.x, b.y, b.w, b.h].map(function (n) {
      return Math.round(n * 100) / 100;
    }).join(' '));
  }
  function reset(svg) {
    var o = svg.vlOrigin;
    setBox(svg, { x: o.x, y: o.y, w: o.w, h: o.h });
  }
  function zoom(svg, factor, px, py) {
    var b = box(svg);
    var w = Math.min(svg.vlOrigin.w, Math.max(svg.vlOrigin.w / 64, b.w * factor));
    var k = w / b.w;
    setBox(svg, { x: px - (px - b.x) * k, y: py - (py - b.y) * k, w: w, h: 0 });
  }
  function svgPoint(svg, clientX, clientY) {
    var m = svg.getScreenCTM();
    var p = svg.createSVGPoint();
    p.x = clientX;
    p.y = clientY;
    return m ? p.matrixTransform(m.inverse()) : p;
  }
  var drag = null;
  var dragged = false;
  all('.zoomable svg').forEach(function (svg) {
    svg.vlOrigin = box(svg);
    svg.addEventListener('wheel', function (e) {
      // A plain wheel scrolls the page; with Ctrl, Shift or the command key it zooms.
      if (!(e.ctrlKey || e.shiftKey || e.metaKey)) { return; }
      e.preventDefault();
      var p = svgPoint(svg, e.clientX, e.clientY);
      zoom(svg, Math.exp(Math.max(-5, Math.min(5, e.deltaY * 0.002))), p.x, p.y);
    }, { passive: false });
    svg.addEventListener('mousedown', function (e) {
      if (e.button !== 0) { return; }
      e.preventDefault();
      drag = { svg: svg, x: e.clientX, y: e.clientY, b: box(svg) };
      dragged = false;
    });
    svg.addEventListener('dblclick', function () { reset(svg); });
  });
  window.addEventListener('mousemove', function (e) {
    if (!drag) { return; }
    var dx = e.clientX - drag.x;
    var dy = e.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) { dragged = true; }
    if (!dragged) { return; }
    drag.svg.classList.add('dragging');
    var r = drag.svg.getBoundingClientRect();
    var scale = drag.b.w / Math.max(1, r.width);
    setBox(drag.svg, { x: drag.b.x - dx * scale, y: drag.b.y - dy * scale, w: drag.b.w, h: 0 });
  });
  window.addEventListener('mouseup', function () {
    if (drag) { drag.svg.classList.remove('dragging'); }
    drag = null;
  });
  all('[data-zoom]').forEach(function (button) {
    button.addEventListener('click', function () {
      var scope = doc.getElementById(button.getAttribute('data-scope'));
      all('.zoomable svg', scope).forEach(function (svg) {
        var b = box(svg);
        var how = button.getAttribute('data-zoom');
        if (how === 'reset') {
          reset(svg);
        } else {
          zoom(svg, how === 'in' ? 0.5 : 2, b.x + b.w / 2, b.y + b.h / 2);
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
      var z = { before: svg.getAttribute('viewBox') };
      var plain = new WheelEvent('wheel', { deltaY: -400, clientX: cx, clientY: cy, bubbles: true, cancelable: true });
      svg.dispatchEvent(plain);
      z.plainWheelScrolls = !plain.defaultPrevented && svg.getAttribute('viewBox') === z.before;
      svg.dispatchEvent(new WheelEvent('wheel', { deltaY: -400, ctrlKey: true, clientX: cx, clientY: cy, bubbles: true, cancelable: true }));
      z.zoomed = svg.getAttribute('viewBox');
      svg.dispatchEvent(new MouseEvent('mousedown', { button: 0, clientX: cx, clientY: cy, bubbles: true }));
      window.dispatchEvent(new MouseEvent('mousemove', { clientX: cx + 120, clientY: cy, bubbles: true }));
      window.dispatchEvent(new MouseEvent('mouseup', { clientX: cx + 120, clientY: cy, bubbles: true }));
      dragged = false;
      z.panned = svg.getAttribute('viewBox');
      var reset = file.querySelector('[data-zoom="reset"]');
      if (reset) { click(reset); }
      z.reset = svg.getAttribute('viewBox');
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
