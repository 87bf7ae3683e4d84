// A page's live parts, pushed or polled: the class board, a guided run (the dashboard and the
// presenter use live.js, which does the same for their panels).
//
// Pushed (the body has sse-connect, web/push.py): htmx's SSE extension holds the page's stream,
// and each element with sse-swap="<event>" is replaced by that event's HTML. Here we only veto a
// swap that would lose what the viewer is doing (a form waiting for its answer, a press not yet
// released), skip one that shows nothing new, keep the folds the viewer opened, and fill the CSRF
// field of a pushed form (pushed HTML carries nobody's token) from this page's own.
//
// Polled (push off, the stream refused, or no first event within STREAM_GRACE_MS): each element
// with data-poll-ms="<ms>" is sent "refresh" that often, on which it fetches itself (its hx-get).
// The indicator says which.
(function () {
  "use strict";
  var STREAM_GRACE_MS = 3000;
  var pushed = document.body.hasAttribute("sse-connect") && typeof EventSource !== "undefined";
  var mode = pushed ? "starting" : "poll";
  var graceTimer = null;
  var pressed = null;
  var held = [];  // elements whose pushed swap was vetoed: fetched once they are free

  var POLL_TICK_MS = 250;
  var polledAt = typeof WeakMap !== "undefined" ? new WeakMap() : null;

  // While not pushed: each [data-poll-ms] element fetches itself that often (none while a fetch of
  // it is under way, or while the viewer is in the middle of a click on it).
  function pollDue() {
    if (mode !== "poll" || !polledAt) return;  // "starting": the stream has STREAM_GRACE_MS to say hello
    var now = Date.now();
    document.querySelectorAll("[data-poll-ms]").forEach(function (element) {
      var every = parseInt(element.dataset.pollMs, 10) || 1000;
      if (now - (polledAt.get(element) || 0) < every || busy(element)) return;
      polledAt.set(element, now);
      htmx.trigger(element, "refresh");
    });
  }

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

  // The stream did not deliver (yet): the elements poll until it does.
  function fallBack(delay) {
    clearTimeout(graceTimer);
    graceTimer = setTimeout(function () {
      if (mode !== "poll") { mode = "poll"; indicate("live"); }
    }, delay);
  }

  function busy(element) {
    return element.classList.contains("htmx-request") || element.querySelector(".htmx-request") !== null
      || (pressed !== null && element.contains(pressed));
  }

  function flushHeld() {
    held = held.filter(function (element) {
      if (!element.isConnected) return false;
      if (busy(element)) return true;
      htmx.trigger(element, "refresh");  // its own hx-get: what it shows now
      return false;
    });
  }

  var sources = typeof WeakSet !== "undefined" ? new WeakSet() : null;

  function listen(source) {
    if (!sources || sources.has(source)) return;
    sources.add(source);
    source.addEventListener("hello", function () {
      clearTimeout(graceTimer);
      mode = "push";
      indicate("live", "");
    });
    source.addEventListener("refused", function (event) {
      clearTimeout(graceTimer);
      mode = "poll";
      indicate("live", "Push unavailable: " + event.data);
    });
    source.addEventListener("lab-status", function (event) { indicate(event.data === "ok" ? "live" : "offline"); });
  }

  // Open folds (<details>) of an element about to be replaced, by their class, to open again after.
  var reopen = {};

  document.addEventListener("DOMContentLoaded", function () {
    indicate("live");
    if (pushed) {
      document.body.addEventListener("htmx:sseOpen", function (event) { listen(event.detail.source); });
      document.body.addEventListener("htmx:sseError", function () {
        if (mode === "push") fallBack(STREAM_GRACE_MS);
      });
      document.body.addEventListener("htmx:sseBeforeMessage", function (event) {
        var element = event.target;
        if (element.dataset.pushed === event.detail.data) {
          event.preventDefault();  // what it shows already (a reconnect sends everything again)
        } else if (busy(element)) {
          event.preventDefault();
          if (held.indexOf(element) === -1) held.push(element);
        } else {
          element.dataset.pushed = event.detail.data;
          if (element.id) {
            reopen[element.id] = Array.prototype.map.call(element.querySelectorAll("details[open]"),
                                                          function (fold) { return fold.className; });
          }
        }
      });
      document.body.addEventListener("htmx:sseMessage", function (event) {
        var id = event.target.id;
        var replaced = id ? document.getElementById(id) : null;  // outerHTML: a new element
        if (replaced && replaced !== event.target) replaced.dataset.pushed = event.detail.data;
        (reopen[id] || []).forEach(function (className) {
          var fold = replaced && replaced.querySelector("details" + (className ? "." + className.split(" ").join(".") : ""));
          if (fold) fold.open = true;
        });
        delete reopen[id];
      });
      fallBack(STREAM_GRACE_MS);
    }
    document.body.addEventListener("htmx:afterRequest", function () { setTimeout(flushHeld, 0); });
    setInterval(pollDue, POLL_TICK_MS);
    document.addEventListener("pointerdown", function (event) { pressed = event.target; }, true);
    function release() {
      if (pressed === null) return;
      setTimeout(function () { pressed = null; flushHeld(); }, 0);  // after the click, not before it
    }
    document.addEventListener("pointerup", release, true);
    document.addEventListener("pointercancel", release, true);
    // A pushed form's CSRF field is empty: this page's own token goes in as it is sent.
    document.addEventListener("submit", function (event) {
      var token = document.querySelector('meta[name="csrf-token"]');
      event.target.querySelectorAll("input[data-page-token]").forEach(function (input) {
        if (!input.value && token) input.value = token.content;
      });
    }, true);
  });
})();
