package org.kbert.classifier

import android.app.Activity
import android.os.Bundle
import android.os.SystemClock
import android.widget.Button
import android.widget.EditText
import android.widget.TextView
import com.google.mediapipe.tasks.core.BaseOptions
import com.google.mediapipe.tasks.text.textclassifier.TextClassifier
import java.util.Locale
import java.util.concurrent.Executors

/**
 * One screen: type a text, press Classify, read every label's score and the latency.
 *
 * MediaPipe's TextClassifier does the whole job on the device: WordPiece
 * tokenization with the vocabulary packed in the model's metadata, the BERT model,
 * and the label names. The model already ends in its probabilities: a softmax for
 * one label a text, each label's sigmoid for a multi-label model, whose threshold
 * (threshold.txt) marks every label that reaches it; "none" there marks the likeliest.
 */
class MainActivity : Activity() {
    // Loading and classifying run off the UI thread, one at a time.
    private val worker = Executors.newSingleThreadExecutor()
    private var classifier: TextClassifier? = null
    private var labels: List<String> = emptyList()
    // A multi-label model's threshold; null: one label a text.
    private var threshold: Float? = null

    override fun onCreate(savedInstanceState: Bundle?) {
        super.onCreate(savedInstanceState)
        setContentView(R.layout.activity_main)
        val input = findViewById<EditText>(R.id.text_input)
        val button = findViewById<Button>(R.id.classify_button)
        val latency = findViewById<TextView>(R.id.latency)
        val results = findViewById<TextView>(R.id.results)

        worker.execute {
            try {
                val loadedLabels = assets.open(LABELS_ASSET).bufferedReader().readLines()
                    .filter { it.isNotEmpty() }
                val loadedThreshold = assets.open(THRESHOLD_ASSET).bufferedReader().readText().trim().toFloatOrNull()
                val options = TextClassifier.TextClassifierOptions.builder()
                    .setBaseOptions(BaseOptions.builder().setModelAssetPath(MODEL_ASSET).build())
                    .build()
                val loaded = TextClassifier.createFromOptions(this, options)
                runOnUiThread {
                    labels = loadedLabels
                    threshold = loadedThreshold
                    classifier = loaded
                    latency.text = ""
                    button.isEnabled = true
                }
            } catch (e: Exception) {
                runOnUiThread {
                    latency.text = getString(R.string.missing_model, MODEL_ASSET, e.message)
                }
            }
        }

        button.setOnClickListener {
            val text = input.text.toString()
            val loaded = classifier ?: return@setOnClickListener
            worker.execute {
                val start = SystemClock.elapsedRealtimeNanos()
                val result = loaded.classify(text)
                val millis = (SystemClock.elapsedRealtimeNanos() - start) / 1e6
                val scores = result.classificationResult().classifications()[0].categories()
                    .associate { it.categoryName() to it.score() }
                // Every label of labels.txt, best first, the predicted ones marked; a
                // label the model does not know would show as "?".
                val ranked = labels.sortedByDescending { scores[it] ?: -1f }
                val cut = threshold
                val chosen = if (cut == null) ranked.take(1) else ranked.filter { (scores[it] ?: 0f) >= cut }
                val lines = ranked.joinToString("\n") {
                    val score = scores[it]?.let { s -> String.format(Locale.US, "%.3f", s) } ?: "?"
                    String.format(Locale.US, "%s %-12s %s", if (it in chosen) "●" else " ", it, score)
                }
                runOnUiThread {
                    results.text = lines
                    latency.text = getString(R.string.latency, millis)
                }
            }
        }
    }

    override fun onDestroy() {
        worker.execute { classifier?.close() }
        worker.shutdown()
        super.onDestroy()
    }

    companion object {
        // mobile/copy_model_to_app.py copies these three files into src/main/assets.
        const val MODEL_ASSET = "text_classifier.tflite"
        const val LABELS_ASSET = "labels.txt"
        const val THRESHOLD_ASSET = "threshold.txt"
    }
}
