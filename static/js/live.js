// Live panels. Once a second the page asks GET /live for one fingerprint per panel (a few index
// lookups on the server). Only a panel whose fingerprint differs from the one it was rendered
// with (data-fingerprint) gets a "refresh" event, on which htmx fetches and swaps it (see
// templates/dashboard/panels/_frame.html). The chart answers the same event itself (chart.js).
(function () {
  "use strict";
  var POLL_MS = 1000;
  var board = document.querySelector("[data-live-url]");
  var indicator = document.getElementById("live-indicator");
  var timer = null;
  var polling = false;

  function setIndicator(state) {
    if (!indicator || indicator.dataset.state === state) return;
    indicator.dataset.state = state;
    indicator.textContent = state === "live" ? "● live" : "✕ offline: retrying";
  }

  // Someone typing in a form inside a live block: swapping it would throw their input away.
  function editing(element) {
    var focused = document.activeElement;
    return focused && element.contains(focused) && focused.matches("input, select, textarea");
  }

  function refresh(name, fingerprint) {
    var element = document.querySelector('[data-live="' + name + '"]');
    if (!element || element.dataset.fingerprint === fingerprint || editing(element)) return;
    htmx.trigger(element, "refresh");
  }

  function schedule(delay) {
    clearTimeout(timer);
    timer = setTimeout(poll, delay);
  }

  function poll() {
    if (polling) return schedule(POLL_MS);
    polling = true;
    fetch(board.dataset.liveUrl, { headers: { Accept: "application/json" }, cache: "no-store" })
      .then(function (response) {
        if (!response.ok) throw new Error("GET /live answered " + response.status);
        return response.json();
      })
      .then(function (body) {
        setIndicator("live");
        Object.keys(body.fingerprints).forEach(function (name) { refresh(name, body.fingerprints[name]); });
      })
      .catch(function () { setIndicator("offline"); })
      .finally(function () { polling = false; schedule(POLL_MS); });
  }

  window.labLive = { pollNow: function () { schedule(0); } };

  document.addEventListener("DOMContentLoaded", function () {
    if (!board) return;
    poll();

    // A control was used: look for its effect now rather than within the second. A menu that
    // acted on change (the fault menu) gives the focus back, so its panel may refresh again.
    document.body.addEventListener("htmx:afterRequest", function (event) {
      if (event.detail.requestConfig.verb !== "post") return;
      if (event.detail.elt.matches("select")) event.detail.elt.blur();
      schedule(150);
    });
    document.body.addEventListener("focusout", function () { schedule(200); });

    // With LAB_TOKEN set, a control answers with the sign-in page: go there instead of swapping it in.
    document.body.addEventListener("htmx:beforeSwap", function (event) {
      var url = event.detail.xhr.responseURL || "";
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
      if (dialog && event.detail.target.id === "drill-body" && !dialog.open) dialog.showModal();
    });
    if (dialog) {
      dialog.addEventListener("click", function (event) {
        if (event.target === dialog) dialog.close();  // a click on the backdrop closes it
      });
    }
  });
})();
