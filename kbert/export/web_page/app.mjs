// The page's script: loads the exported MediaPipe file with MediaPipe Tasks
// for Web (the copy beside this file, no CDN) and runs it on what the user types.
// model.json, written by `kbert export`, names the file and its kind.
import { FilesetResolver, TextClassifier, TextEmbedder } from "./node_modules/@mediapipe/tasks-text/text_bundle.mjs";

// MediaPipe resolves the wasm files and the model against the document's
// base, not this module's: both are given as absolute same-origin URLs.
const here = new URL(".", import.meta.url);
const status = document.getElementById("status");

function setStatus(text, error = false) {
  status.textContent = text;
  status.classList.toggle("error", error);
}

async function load() {
  const response = await fetch(new URL("model.json", here));
  if (!response.ok) throw new Error(`model.json: HTTP ${response.status}`);
  const config = await response.json();
  document.title = `${config.name}: kbert in the browser`;
  document.getElementById("title").textContent = config.name;
  const wasm = await FilesetResolver.forTextTasks(new URL("node_modules/@mediapipe/tasks-text/wasm", here).href);
  const baseOptions = { modelAssetPath: new URL(config.model, here).href, delegate: "CPU" };
  document.getElementById("footer").textContent =
    `${config.model.split("/").pop()} (${config.task}), run by MediaPipe Tasks for Web ${config.mediapipe} in this browser.`;
  if (config.kind === "text_classifier") {
    // maxResults -1: every label, as kbert's Python check asks for.
    const classifier = await TextClassifier.createFromOptions(wasm, { baseOptions, maxResults: -1 });
    showClassifier(classifier, config.threshold);
  } else if (config.kind === "text_embedder") {
    // The model's own vectors, as kbert's Python check runs it.
    const embedder = await TextEmbedder.createFromOptions(wasm, { baseOptions, l2Normalize: false, quantize: false });
    showEmbedder(embedder);
  } else {
    throw new Error(`model.json: unknown kind ${config.kind}`);
  }
  setStatus("Ready: the model runs in this browser, offline.");
}

function showClassifier(classifier, threshold) {
  const text = document.getElementById("text");
  const button = document.getElementById("classify");
  const body = document.querySelector("#scores tbody");
  const run = () => {
    const categories = classifier.classify(text.value).classifications[0].categories;
    categories.sort((a, b) => b.score - a.score);
    body.replaceChildren(...categories.map((category, rank) => {
      const row = document.createElement("tr");
      // One label (softmax): the top one; several (sigmoid): those at the threshold or above.
      const chosen = threshold === null ? rank === 0 : category.score >= threshold;
      row.classList.toggle("chosen", chosen);
      row.dataset.label = category.categoryName;
      row.dataset.score = String(category.score);  // every digit, for a check; the cell shows four
      row.innerHTML = '<td class="label"></td><td class="bar"><div></div></td><td class="score"></td>';
      row.cells[0].textContent = category.categoryName;
      row.cells[1].firstChild.style.width = `${(100 * category.score).toFixed(1)}%`;
      row.cells[2].textContent = category.score.toFixed(4);
      return row;
    }));
    // Which text the table shows, for whoever reads it back.
    body.parentElement.dataset.text = text.value;
  };
  button.addEventListener("click", run);
  text.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); run(); }
  });
  document.getElementById("classifier").hidden = false;
  button.disabled = false;
  run();
}

function showEmbedder(embedder) {
  const first = document.getElementById("text-a");
  const second = document.getElementById("text-b");
  const button = document.getElementById("compare");
  const output = document.getElementById("similarity");
  const run = () => {
    const [a, b] = [first.value, second.value].map((value) => embedder.embed(value).embeddings[0]);
    const cosine = TextEmbedder.cosineSimilarity(a, b);
    output.textContent = cosine.toFixed(4);
    output.dataset.cosine = String(cosine);
    output.dataset.texts = JSON.stringify([first.value, second.value]);
  };
  button.addEventListener("click", run);
  document.getElementById("embedder").hidden = false;
  button.disabled = false;
  run();
}

load().catch((error) => setStatus(`Could not load the model: ${error.message}`, true));
