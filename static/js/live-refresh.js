// A page's live parts, pushed or polled: the dashboard's and the presenter's panels, the class
// board, a guided run. Each part fetches itself (its hx-get) when it is sent a "refresh" event;
// this script decides when, and is the only one that does.
//
// Pushed (the page's body has sse-connect, web/push.py): htmx's SSE extension holds one event
// stream, and each element with sse-swap="<event>" is replaced by that event's HTML. Here we only
// veto a swap that would lose what the viewer is doing (typing in it, a form waiting for its
// answer, a press not yet released: the part is fetched once it is free), skip one that shows
// nothing new, let a panel fetched with a query (the viewer's own choice, a tab) fetch itself
// with that choice, keep the folds the viewer opened, hand the chart its series, and fill the
// CSRF field of a pushed form (pushed HTML carries nobody's token) from this page's own.
//
// Polled (the fallback: push off, the stream refused past its cap, or a stream that does not
// deliver its first event within STREAM_GRACE_MS, as behind a buffering proxy):
// - panels (data-live="<name>", inside an element with data-live-url): once a second the page asks
//   GET /live for one fingerprint per panel, and only a panel whose fingerprint differs from the
//   one it was rendered with (data-fingerprint) is sent "refresh" (templates/dashboard/panels/
//   _frame.html). The chart answers the same event itself (chart.js).
// - other parts (data-poll-ms="<ms>") are sent "refresh" that often.
// The indicator says which of the two the page uses.
(function () {
  "use strict";
  var POLL_MS = 1000;
  var POLL_TICK_MS = 250;
  var STREAM_GRACE_MS = 3000;
  var board = document.querySelector("[data-live-url]");
  var pushed = document.body.hasAttribute("sse-connect") && typeof EventSource !== "undefined";
  var mode = pushed ? "starting" : "poll";  // "push" while the stream delivers, else "poll"
  var timer = null;
  var graceTimer = null;
  var polling = false;
  var pressed = null;
  var held = [];  // {element, fingerprint}: a pushed swap held back, fetched once the part is free
  var polledAt = typeof WeakMap !== "undefined" ? new WeakMap() : null;

  function indicate(state, note) {
    var indicator = document.getElementById("live-indicator");
    var noteElement = document.getElementById("live-note");
    if (indicator) {
      indicator.dataset.state = state;
      indicator.dataset.mode = mode === "push" ? "push" : "poll";
      indicator.textContent = state === "offline" ? "✕ offline: retrying"
        : (mode === "push" ? "● live · push" : "● live · polling");
    }
    if (noteElement && note !== undefined) {
      noteElement.textContent = note;
      noteElement.hidden = !note;
    }
  }

  // Someone typing in a form inside a live part: swapping it would throw their input away.
  function editing(element) {
    var focused = document.activeElement;
    return focused && element.contains(focused) && focused.matches("input, select, textarea");
  }

  // A form inside a live part waits for its answer: replacing the part now would leave the
  // answer (its outcome banner) nowhere to go.
  function busy(element) {
    return element.classList.contains("htmx-request") || element.querySelector(".htmx-request") !== null;
  }

  // A pointer pressed inside a live part: a click is a press and a release on the same element,
  // so swapping the part in between would lose the click. The part waits for the release.
  function holding(element) {
    return pressed !== null && element.contains(pressed);
  }

  function free(element) {
    return !editing(element) && !busy(element) && !holding(element);
  }

  // ``fingerprint``: what the held-back swap would have shown (a panel's), or null.
  function hold(element, fingerprint) {
    held = held.filter(function (entry) { return entry.element !== element; });
    held.push({ element: element, fingerprint: fingerprint });
  }

  // A held part replaced meanwhile (a panel swaps its outer HTML): its panel as it is now.
  function current(element) {
    if (element.isConnected) return element;
    var name = element.dataset.live;
    return name ? document.querySelector('[data-live="' + name + '"]') : null;
  }

  function flushHeld() {
    held = held.filter(function (entry) {
      var element = current(entry.element);
      if (!element) return false;
      if (!free(element)) return true;
      if (!entry.fingerprint || element.dataset.fingerprint !== entry.fingerprint) htmx.trigger(element, "refresh");
      return false;
    });
  }

  // --- polled ----------------------------------------------------------------------------------

  function refreshPanel(name, fingerprint) {
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
    if (!board || mode === "push") return;
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
            if (body.fingerprints) {
              Object.keys(body.fingerprints).forEach(function (name) { refreshPanel(name, body.fingerprints[name]); });
            }
            throw new Error("GET /live answered " + response.status);
          });
        }
        return response.json();
      })
      .then(function (body) {
        if (mode === "starting") mode = "poll";
        indicate("live");
        Object.keys(body.fingerprints).forEach(function (name) { refreshPanel(name, body.fingerprints[name]); });
      })
      .catch(function () { indicate("offline"); })
      .finally(function () { polling = false; schedule(POLL_MS); });
  }

  function refreshPolled(element) {
    polledAt.set(element, Date.now());
    htmx.trigger(element, "refresh");
  }

  // Each [data-poll-ms] part fetches itself that often (none while a fetch of it is under way,
  // or while the viewer is in the middle of a click on it).
  function pollDue() {
    if (mode !== "poll" || !polledAt) return;  // "starting": the stream has STREAM_GRACE_MS to say hello
    var now = Date.now();
    document.querySelectorAll("[data-poll-ms]").forEach(function (element) {
      var every = parseInt(element.dataset.pollMs, 10) || 1000;
      if (now - (polledAt.get(element) || 0) < every || busy(element) || holding(element)) return;
      refreshPolled(element);
    });
  }

  // Something changed that the viewer is waiting to see (the presenter's next step): look now.
  function pollNow() {
    if (mode === "push") return;
    schedule(0);
    if (!polledAt) return;
    document.querySelectorAll("[data-poll-ms]").forEach(function (element) {
      if (!busy(element)) refreshPolled(element);
    });
  }

  // The stream did not deliver (yet): poll until it does.
  function fallBack(delay) {
    clearTimeout(graceTimer);
    graceTimer = setTimeout(function () {
      if (mode !== "poll") { mode = "poll"; indicate("live"); }
      schedule(0);
    }, delay);
  }

  // --- pushed ----------------------------------------------------------------------------------

  var sources = typeof WeakSet !== "undefined" ? new WeakSet() : null;

  function listen(source) {
    if (!sources || sources.has(source)) return;
    sources.add(source);
    source.addEventListener("hello", function () {
      clearTimeout(graceTimer);
      clearTimeout(timer);
      mode = "push";
      indicate("live", "");
    });
    source.addEventListener("refused", function (event) {
      clearTimeout(graceTimer);
      mode = "poll";
      indicate("live", "Push unavailable: " + event.data);
      schedule(0);
    });
    source.addEventListener("lab-status", function (event) { indicate(event.data === "ok" ? "live" : "offline"); });
    source.addEventListener("chart", function (event) {
      var chart = document.querySelector('[data-live="chart"]');
      var data = JSON.parse(event.data);
      if (chart && chart.dataset.fingerprint !== data.fingerprint) {
        chart.dispatchEvent(new CustomEvent("chart-data", { detail: data }));
      }
    });
  }

  // Whether the pushed HTML is what the part shows already (a reconnect sends everything again):
  // a panel by its fingerprint, another part by the HTML it was last pushed.
  function showsAlready(element, data, fingerprint) {
    if (element.dataset.live) return fingerprint !== null && element.dataset.fingerprint === fingerprint;
    return element.dataset.pushed === data;
  }

  // Open folds (<details>) of a part about to be replaced, by their class, to open again after.
  // Only parts that are not panels: a panel's polled refresh would close them anyway.
  var reopen = {};

  function rememberFolds(element, data) {
    element.dataset.pushed = data;
    if (element.id) {
      reopen[element.id] = Array.prototype.map.call(element.querySelectorAll("details[open]"),
                                                    function (fold) { return fold.className; });
    }
  }

  function reopenFolds(event) {
    if (event.target.dataset.live) return;
    var id = event.target.id;
    var replaced = id ? document.getElementById(id) : null;  // outerHTML: a new element
    if (replaced && replaced !== event.target) replaced.dataset.pushed = event.detail.data;
    (reopen[id] || []).forEach(function (className) {
      var fold = replaced && replaced.querySelector("details" + (className ? "." + className.split(" ").join(".") : ""));
      if (fold) fold.open = true;
    });
    delete reopen[id];
  }

  function beforePushedSwap(event) {
    var element = event.target;
    var data = event.detail.data || "";
    var found = element.dataset.live ? /data-fingerprint="([^"]*)"/.exec(data) : null;
    var fingerprint = found ? found[1] : null;
    if (showsAlready(element, data, fingerprint)) {
      event.preventDefault();
    } else if (!free(element)) {
      event.preventDefault();
      hold(element, fingerprint);
      if (holding(element)) element.dataset.held = "pointer";
    } else if (element.dataset.live && (element.getAttribute("hx-get") || "").indexOf("?") !== -1) {
      event.preventDefault();  // the viewer's own choice (a tab): fetch it with that choice
      htmx.trigger(element, "refresh");
    } else if (!element.dataset.live) {
      rememberFolds(element, data);
    }
  }

  function startPush() {
    document.body.addEventListener("htmx:sseOpen", function (event) { listen(event.detail.source); });
    document.body.addEventListener("htmx:sseError", function () {
      if (mode === "push") { indicate("live"); fallBack(STREAM_GRACE_MS); }
    });
    document.body.addEventListener("htmx:sseBeforeMessage", beforePushedSwap);
    document.body.addEventListener("htmx:sseMessage", reopenFolds);
    fallBack(STREAM_GRACE_MS);
  }

  window.labLive = { pollNow: pollNow };

  document.addEventListener("DOMContentLoaded", function () {
    if (!board) indicate("live");  // a page with panels says so once /live or the stream answered
    if (pushed) startPush(); else if (board) poll();
    setInterval(pollDue, POLL_TICK_MS);

    // A control was used: look for its effect now rather than within the second. A menu that
    // acted on change (the fault menu) gives the focus back, so its panel may refresh again.
    document.body.addEventListener("htmx:afterRequest", function (event) {
      if (event.detail.requestConfig.verb !== "post") {
        setTimeout(flushHeld, 0);  // a part held back while its own fetch was under way
        return;
      }
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
        hold(target, null);
      }
    });
    // A pushed form's CSRF field is empty: this page's own token goes in as it is sent.
    document.addEventListener("submit", function (event) {
      var token = document.querySelector('meta[name="csrf-token"]');
      event.target.querySelectorAll("input[data-page-token]").forEach(function (input) {
        if (!input.value && token) input.value = token.content;
      });
    }, true);
  });
})();
