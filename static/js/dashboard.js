// The dashboard's and the presenter's page behaviour that is not refreshing (that is
// live-refresh.js's): a control answered by the sign-in page, projector mode, the drill-down.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
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
