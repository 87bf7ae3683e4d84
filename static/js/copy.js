// A button with data-copy="<selector>" copies that element's text to the clipboard, and says so in
// the [data-copied] element beside it. The clipboard API needs a secure context (https or
// localhost); elsewhere the text is selected, for Ctrl+C. Delegated: buttons swapped in by htmx work too.
document.addEventListener("click", async (event) => {
  const button = event.target.closest("[data-copy]");
  if (!button) return;
  const source = document.querySelector(button.dataset.copy);
  const status = button.parentElement.querySelector("[data-copied]");
  if (!source) return;
  try {
    await navigator.clipboard.writeText(source.textContent);
    if (status) status.textContent = "Copied.";
  } catch (error) {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    if (status) status.textContent = "Selected: press Ctrl+C to copy.";
  }
});
