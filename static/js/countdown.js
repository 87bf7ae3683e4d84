// A countdown in a live panel: <b data-countdown="SECONDS"> counts down from when the panel arrived
// (a pushed or polled panel replaces the element, with a fresh number), then says it is due.
const deadlines = new WeakMap();
setInterval(() => {
  for (const element of document.querySelectorAll("[data-countdown]")) {
    if (!deadlines.has(element)) deadlines.set(element, Date.now() + Number(element.dataset.countdown) * 1000);
    const left = Math.round((deadlines.get(element) - Date.now()) / 1000);
    element.textContent = left > 0 ? `about ${left} s left` : "any moment now";
  }
}, 1000);
