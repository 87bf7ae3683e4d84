// The expected-vs-actual chart. It keeps one uPlot canvas for the life of the page: on each
// "refresh" event (sent by live-refresh.js when the chart's fingerprint changed) it fetches the series
// as JSON, on a "chart-data" event (pushed: live-refresh.js hands it the series) it takes that, and calls
// setData, so refreshing never flickers or jumps. Lines differ by dash as
// well as by colour (Okabe-Ito), so they read the same to colourblind eyes and in greyscale.
(function () {
  "use strict";
  var HEIGHT = 250;
  var LINES = [
    { stroke: "#111418", dash: [12, 7], width: 3 },   // expected: black, dashed
    { stroke: "#d55e00", dash: [], width: 4 },        // actual (the lab's own accounts): vermillion, solid
    { stroke: "#0072b2", dash: [3, 5], width: 4 },    // lanes: blue dotted, green dash-dot, purple...
    { stroke: "#009e73", dash: [14, 5, 3, 5], width: 4 },
    { stroke: "#cc79a7", dash: [6, 4], width: 4 },
    { stroke: "#e69f00", dash: [2, 3], width: 4 }
  ];

  function money(cents) {
    return (cents / 100).toLocaleString(undefined, { maximumFractionDigits: 0 });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var panel = document.getElementById("panel-chart");
    if (!panel || typeof uPlot === "undefined") return;
    var box = document.getElementById("chart");
    var empty = panel.querySelector(".chart-empty");
    var stale = panel.querySelector(".chart-stale");
    var plot = null;
    var labels = "";
    var loading = false;

    var stepped = uPlot.paths.stepped({ align: 1 });

    function build(data) {
      if (plot) plot.destroy();
      var font = getComputedStyle(document.documentElement).fontSize;
      var axisFont = "600 " + Math.round(parseFloat(font) * 0.8) + "px DejaVu Sans, sans-serif";
      plot = new uPlot({
        width: box.clientWidth, height: HEIGHT,
        legend: { live: false },
        cursor: { drag: { x: false, y: false } },
        scales: { x: { time: true } },
        axes: [
          // Wall-clock seconds, spaced wide enough to read from the back of a room.
          { font: axisFont, stroke: "#111418", grid: { stroke: "#dde3ea" }, space: 110,
            values: function (u, values) {
              return values.map(function (v) { return new Date(v * 1000).toTimeString().slice(0, 8); });
            } },
          { font: axisFont, stroke: "#111418", grid: { stroke: "#dde3ea" }, size: 80,
            values: function (u, values) { return values.map(money); } }
        ],
        series: [{}].concat(data.series.map(function (s, i) {
          var line = LINES[Math.min(i, LINES.length - 1)];
          // Cumulative totals change in steps: draw them as steps, never as slopes between events.
          return { label: s.label, stroke: line.stroke, width: line.width, dash: line.dash, paths: stepped,
                   value: function (u, v) { return v == null ? "–" : money(v); } };
        }))
      }, [data.x].concat(data.series.map(function (s) { return s.values; })), box);
    }

    function load() {
      if (loading) return;
      loading = true;
      fetch(panel.dataset.src, { headers: { Accept: "application/json" }, cache: "no-store" })
        .then(function (response) { return response.json(); })
        .then(show)
        .catch(function () { /* the next fingerprint change retries */ })
        .finally(function () { loading = false; });
    }

    function show(data) {
      panel.dataset.fingerprint = data.fingerprint;
      empty.hidden = data.x.length > 0;
      // A slow series (millions of records) comes from its last load while the next one runs.
      // Shown from a second on, as the panels' note (dashboard/panels/_frame.html).
      stale.hidden = data.stale_for == null || data.stale_for < 1;
      if (!stale.hidden) {
        stale.textContent = "Updating: this shows the lab as it was " + Math.floor(data.stale_for) +
          " s ago (one load of this chart takes " + data.took.toFixed(1) + " s at this size).";
      }
      var names = data.series.map(function (s) { return s.label; }).join("|");
      if (!plot || names !== labels) {
        labels = names;
        build(data);
      } else {
        plot.setData([data.x].concat(data.series.map(function (s) { return s.values; })));
      }
    }

    panel.addEventListener("refresh", load);
    // Pushed (static/js/live-refresh.js): the series itself, rendered once for every viewer of the lab.
    panel.addEventListener("chart-data", function (event) { show(event.detail); });
    new ResizeObserver(function () {
      if (plot && box.clientWidth) plot.setSize({ width: box.clientWidth, height: HEIGHT });
    }).observe(box);
    load();
  });
})();
