// Live panels, pushed or polled.
//
// Pushed (the page's body has sse-connect, web/push.py): htmx's SSE extension holds one event
// stream; an event named after a panel carries its new HTML and replaces it (sse-swap). Here we
// only veto a swap that would throw a viewer's input away, or that would show them the server's
// choice where they made their own (a panel fetched with a query), and refresh the chart.
//
// Polled (the fallback: push off, the stream refused past its cap, or a stream that does not
// deliver its first event within STREAM_GRACE_MS, as behind a buffering proxy): once a second the
// page asks GET /live for one fingerprint per panel. Only a panel whose fingerprint differs from
// the one it was rendered with (data-fingerprint) gets a "refresh" event, on which htmx fetches
// and swaps it (see templates/dashboard/panels/_frame.html). The chart answers the same event
// itself (chart.js). The indicator says which of the two the page uses.
(function () {
  "use strict";
  var POLL_MS = 1000;
  var STREAM_GRACE_MS = 3000;
  var board = document.querySelector("[data-live-url]");
  var indicator = document.getElementById("live-indicator");
  var note = document.getElementById("live-note");
  var pushed = document.body.hasAttribute("sse-connect") && typeof EventSource !== "undefined";
  var mode = pushed ? "starting" : "poll";  // "push" while the stream delivers, else "poll"
  var timer = null;
  var graceTimer = null;
  var polling = false;
  var held = {};  // panel -> fingerprint of a pushed swap held back while someone types in it

  function setIndicator(state) {
    if (!indicator) return;
    indicator.dataset.state = state;
    indicator.dataset.mode = mode === "push" ? "push" : "poll";
    indicator.textContent = state === "offline" ? "✕ offline: retrying"
      : (mode === "push" ? "● live · push" : "● live · polling");
  }

  function showNote(text) {
    if (!note) return;
    note.textContent = text || "";
    note.hidden = !text;
  }

  // Someone typing in a form inside a live block: swapping it would throw their input away.
  function editing(element) {
    var focused = document.activeElement;
    return focused && element.contains(focused) && focused.matches("input, select, textarea");
  }

  // A form inside a live block waits for its answer: replacing the block now would leave the
  // answer (its outcome banner) nowhere to go.
  function busy(element) {
    return element.classList.contains("htmx-request") || element.querySelector(".htmx-request") !== null;
  }

  // A pointer pressed inside a live block: a click is a press and a release on the same element,
  // so swapping the block in between would lose the click. The block waits for the release.
  var pressed = null;
  function holding(element) {
    return pressed !== null && element.contains(pressed);
  }

  // Pushed swaps held back (editing, busy, pressed): fetch those panels once they are free.
  function flushHeld() {
    Object.keys(held).forEach(function (name) {
      var element = document.querySelector('[data-live="' + name + '"]');
      if (element && (editing(element) || busy(element) || holding(element))) return;
      if (element && element.dataset.fingerprint !== held[name]) htmx.trigger(element, "refresh");
      delete held[name];
    });
  }

  function refresh(name, fingerprint) {
    var element = document.querySelector('[data-live="' + name + '"]');
    if (!element || element.dataset.fingerprint === fingerprint || editing(element)) return;
    if (holding(element)) {
      element.dataset.held = "pointer";  // stale, refreshed once the pointer is released
      return;
    }
    htmx.trigger(element, "refresh");
  }

  function schedule(delay) {
    clearTimeout(timer);
    if (mode === "push") return;
    timer = setTimeout(poll, delay);
  }

  function poll() {
    if (mode === "push") return;
    if (polling) return schedule(POLL_MS);
    polling = true;
    fetch(board.dataset.liveUrl, { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (response) {
        if (!response.ok) {
          // PostgreSQL down: /live still names the status bar, which answers without the database.
          return response.json().catch(function () { return {}; }).then(function (body) {
            if (body.fingerprints) Object.keys(body.fingerprints).forEach(function (name) { refresh(name, body.fingerprints[name]); });
            throw new Error("GET /live answered " + response.status);
          });
        }
        return response.json();
      })
      .then(function (body) {
        if (mode === "starting") mode = "poll";
        setIndicator("live");
        // The page's other live parts (the presenter's step line, data-poll-ms) fetch themselves too.
        document.querySelectorAll("[data-poll-ms]").forEach(function (element) {
          if (!busy(element)) htmx.trigger(element, "refresh");
        });
        Object.keys(body.fingerprints).forEach(function (name) { refresh(name, body.fingerprints[name]); });
      })
      .catch(function () { setIndicator("offline"); })
      .finally(function () { polling = false; schedule(POLL_MS); });
  }

  // The stream did not deliver (yet): poll until it does.
  function fallBack(delay) {
    clearTimeout(graceTimer);
    graceTimer = setTimeout(function () {
      if (mode === "push" || mode === "starting") { mode = "poll"; setIndicator("live"); }
      schedule(0);
    }, delay);
  }

  var sources = typeof WeakSet !== "undefined" ? new WeakSet() : null;

  function listen(source) {
    if (!sources || sources.has(source)) return;
    sources.add(source);
    source.addEventListener("hello", function () {
      clearTimeout(graceTimer);
      clearTimeout(timer);
      mode = "push";
      showNote("");
      setIndicator("live");
    });
    source.addEventListener("refused", function (event) {
      mode = "poll";
      showNote("Push unavailable: " + event.data);
      setIndicator("live");
      fallBack(0);
    });
    source.addEventListener("lab-status", function (event) { setIndicator(event.data === "ok" ? "live" : "offline"); });
    source.addEventListener("chart", function (event) {
      var chart = document.querySelector('[data-live="chart"]');
      var data = JSON.parse(event.data);
      if (chart && chart.dataset.fingerprint !== data.fingerprint) {
        chart.dispatchEvent(new CustomEvent("chart-data", { detail: data }));
      }
    });
  }

  function startPush() {
    document.body.addEventListener("htmx:sseOpen", function (event) { listen(event.detail.source); });
    document.body.addEventListener("htmx:sseError", function () {
      if (mode === "push") { setIndicator("live"); fallBack(STREAM_GRACE_MS); }
    });
    document.body.addEventListener("htmx:sseBeforeMessage", function (event) {
      var element = event.target;
      var found = /data-fingerprint="([^"]*)"/.exec(event.detail.data || "");
      var fingerprint = found ? found[1] : null;
      if (fingerprint !== null && element.dataset.fingerprint === fingerprint) {
        event.preventDefault();  // what it shows already (a reconnect sends every panel)
      } else if (editing(element) || busy(element) || holding(element)) {
        event.preventDefault();
        held[element.dataset.live] = fingerprint;
        if (holding(element)) element.dataset.held = "pointer";
      } else if ((element.getAttribute("hx-get") || "").indexOf("?") !== -1) {
        event.preventDefault();  // the viewer's own choice (a tab): fetch it with that choice
        htmx.trigger(element, "refresh");
      }
    });
    fallBack(STREAM_GRACE_MS);
  }

  window.labLive = { pollNow: function () { schedule(0); } };

  document.addEventListener("DOMContentLoaded", function () {
    if (!board) return;
    if (pushed) startPush(); else poll();

    // A control was used: look for its effect now rather than within the second. A menu that
    // acted on change (the fault menu) gives the focus back, so its panel may refresh again.
    document.body.addEventListener("htmx:afterRequest", function (event) {
      if (event.detail.requestConfig.verb !== "post") return;
      if (event.detail.elt.matches("select")) event.detail.elt.blur();
      schedule(150);
      setTimeout(flushHeld, 150);
    });
    document.body.addEventListener("focusout", function () {
      schedule(200);
      setTimeout(flushHeld, 200);  // a pushed swap held back while someone typed
    });
    document.addEventListener("pointerdown", function (event) { pressed = event.target; }, true);
    function release() {
      if (pressed === null) return;
      // After the click event (dispatched right after pointerup), not before it.
      setTimeout(function () { pressed = null; schedule(150); flushHeld(); }, 0);
    }
    document.addEventListener("pointerup", release, true);
    document.addEventListener("pointercancel", release, true);
    // A panel's refresh already under way when the pointer went down: dropped, fetched again later.
    document.body.addEventListener("htmx:beforeSwap", function (event) {
      var target = event.detail.target;
      if (event.detail.requestConfig && event.detail.requestConfig.verb === "get" && target
          && target.matches("[data-live]") && holding(target)) {
        event.detail.shouldSwap = false;
        held[target.dataset.live] = null;
      }
    });

    // With LAB_TOKEN set, a control answers with the sign-in page: go there instead of swapping it in.
    document.body.addEventListener("htmx:beforeSwap", function (event) {
      var url = (event.detail.xhr && event.detail.xhr.responseURL) || "";
      if (url.indexOf("/sign-in") !== -1) {
        event.detail.shouldSwap = false;
        window.location.assign(url);
      }
    });

    // Projector mode: the controls can be hidden, and stay hidden across reloads.
    var toggle = document.getElementById("toggle-controls");
    function showControls(show) {
      document.body.classList.toggle("controls-hidden", !show);
      toggle.setAttribute("aria-expanded", String(show));
      toggle.textContent = show ? "◂ Controls" : "▸ Controls";
      try { localStorage.setItem("lab-controls", show ? "shown" : "hidden"); } catch (e) { /* private mode */ }
    }
    if (toggle) {
      var stored = null;
      try { stored = localStorage.getItem("lab-controls"); } catch (e) { /* private mode */ }
      showControls(stored !== "hidden");
      toggle.addEventListener("click", function () { showControls(document.body.classList.contains("controls-hidden")); });
    }

    // The drill-down opens in a dialog once its content arrives.
    var dialog = document.getElementById("drill");
    document.body.addEventListener("htmx:afterSwap", function (event) {
      // A pushed swap (the SSE extension) has no target in its detail: it is never the drill-down.
      var target = event.detail.target;
      if (dialog && target && target.id === "drill-body" && !dialog.open) dialog.showModal();
    });
    if (dialog) {
      dialog.addEventListener("click", function (event) {
        if (event.target === dialog) dialog.close();  // a click on the backdrop closes it
      });
    }
  });
})();
