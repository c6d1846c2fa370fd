// Copy buttons: shown only when this script runs; each copies the text of
// the element its data-copy names.
"use strict";
document.querySelectorAll("button.copy[data-copy]").forEach((button) => {
  const source = document.getElementById(button.dataset.copy);
  if (!source || !navigator.clipboard) return;
  button.hidden = false;
  button.setAttribute("aria-label", "Copy " + source.textContent.trim());
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(source.textContent.trim());
      button.textContent = "Copied";
    } catch (e) {
      button.textContent = "Copy failed";
    }
    setTimeout(() => { button.textContent = "Copy"; }, 2000);
  });
});
