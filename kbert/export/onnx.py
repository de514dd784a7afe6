"""ONNX from the SavedModel's token signature, with onnxruntime's BERT fusions.

Steps: tf2onnx converts the `serve_tokens` signature (opset `ONNX_OPSET`,
batch and sequence axes left dynamic); onnxruntime's transformer optimizer
fuses each encoder block into Attention, SkipLayerNormalization and BiasGelu;
`quantize_dynamic` then gives an int8 variant (int8 weights per output
channel, activations quantized at run time).

The fusions match only the op forms of `kbert.export.graph`, which the
SavedModel's signatures are traced from; `fusion_counts` reports what fused.
"""

import collections
import functools

import numpy as np

from kbert.config import ENCODER_INPUTS
from kbert.export.savedmodel import TOKENS_SIGNATURE

# LayerNormalization is an ONNX op from opset 17 on; onnxruntime fuses up to 21.
ONNX_OPSET = 17
# Names of the symbolic axes, shown by Netron and onnxruntime's errors.
_AXIS_NAMES = ("batch", "sequence")
# tf2onnx rewrites a ReduceMean over the last axis of a rank-3 tensor into
# GlobalAveragePool, which onnxruntime's LayerNormalization fusion does not
# recognise; every other tf2onnx optimizer runs.
_SKIPPED_TF2ONNX_OPTIMIZERS = ("global_pool_optimizer",)


def convert_savedmodel_to_onnx(version_dir, path, output_names):
    """Converts the SavedModel's `serve_tokens` signature to an ONNX file.

    Args:
        version_dir: str. A SavedModel written by `export_savedmodel`.
        path: str. The .onnx file to write.
        output_names: the signature's outputs to keep: the numeric ones
            (string outputs such as a classifier's `label` stay in the
            SavedModel).
    """
    import onnx
    import tensorflow_text  # noqa: F401  (the SavedModel's text signature uses its ops)
    from tf2onnx import convert, optimizer, tf_loader

    _register_erfc()

    graph_def, inputs, outputs, tables, renames = tf_loader.from_saved_model(
        version_dir,
        None,
        None,
        tag=["serve"],
        signatures=[TOKENS_SIGNATURE],
        return_initialized_tables=True,
        return_tensors_to_rename=True,
    )
    outputs = [name for name in outputs if renames.get(name) in output_names]
    optimizers = collections.OrderedDict(
        (name, step)
        for name, step in optimizer._get_optimizers().items()
        if name not in _SKIPPED_TF2ONNX_OPTIMIZERS
    )
    model, _ = convert._convert_common(
        graph_def,
        name="kbert",
        opset=ONNX_OPSET,
        input_names=inputs,
        output_names=outputs,
        tensors_to_rename=renames,
        initialized_tables=tables,
        optimizers=optimizers,
    )
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        for dim, axis in zip(dims, _AXIS_NAMES):
            if not dim.HasField("dim_value"):
                dim.dim_param = axis
    onnx.save(model, path)


@functools.cache
def _register_erfc():
    """Teaches tf2onnx TensorFlow's `Erfc`, as `1 - Erf`: Keras's exact GELU (`tf.nn.gelu`)
    uses it, as in fill-mask's masked-LM transform (TFLite fuses the same form into GELU)."""
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    @tf_op("Erfc")
    class Erfc:
        @classmethod
        def version_9(cls, ctx, node, **kwargs):
            node.type = "Erf"
            dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
            one = ctx.make_const(utils.make_name("one"), np.array(1, dtype))
            erf = node.output[0]
            complement = ctx.insert_new_node_on_output("Sub", erf, name=utils.make_name(node.name),
                                                       inputs=[one.output[0], erf])
            ctx.copy_shape(erf, complement.output[0])
            ctx.set_dtype(complement.output[0], ctx.get_dtype(erf))


def optimize_onnx(source, path, config):
    """Runs onnxruntime's BERT optimizer; returns its fused-operator counts.

    Args:
        source: str. The ONNX file from `convert_savedmodel_to_onnx`.
        path: str. The optimized file to write.
        config: `BertConfig` of the encoder (heads and width).

    Returns:
        dict op type -> count of fused nodes (only the non-zero ones).
    """
    from onnxruntime.transformers import optimizer
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions

    options = FusionOptions("bert")
    # Keep the (batch, length) 0/1 mask as is; the default turns it into one
    # length per row, which is only right for right-padded masks.
    options.attention_mask_format = AttentionMaskFormat.AttentionMask
    model = optimizer.optimize_model(
        source,
        model_type="bert",
        num_heads=config.num_heads,
        hidden_size=config.hidden_size,
        optimization_options=options,
    )
    model.save_model_to_file(path)
    counts = model.get_fused_operator_statistics()
    return {op: count for op, count in counts.items() if count}


def all_blocks_fused(counts, config):
    """True if every encoder block became Attention, BiasGelu and two SkipLayerNorms.

    The embeddings' sum and LayerNorm fuse as one more SkipLayerNormalization
    (or as EmbedLayerNormalization), so that count may exceed two per block.
    """
    blocks = config.num_layers
    gelu = counts.get("BiasGelu", 0) + counts.get("FastGelu", 0) + counts.get("Gelu", 0)
    return (
        counts.get("Attention", 0) == blocks
        and (gelu == blocks or config.activation == "relu")
        and counts.get("SkipLayerNormalization", 0) >= 2 * blocks
    )


def quantize_onnx(source, path):
    """Dynamic int8 quantization (`onnxruntime.quantization.quantize_dynamic`).

    Weights are quantized per output channel: one scale per column keeps the
    columns of small weights from rounding to a few levels. On MiniLM
    fine-tuned for the Debian task (950 dev texts), one scale per tensor lost
    0.74 point of accuracy (max probability error 0.69); per channel lost 0.0
    (max error 0.24) at the same size (22.5 MiB).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Outputs of onnxruntime's fused (com.microsoft) ops have no inferred type;
    # they are all float32.
    quantize_dynamic(
        source,
        path,
        weight_type=QuantType.QInt8,
        per_channel=True,
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )


class OnnxRunner:
    """An onnxruntime CPU session on token inputs.

    Args:
        path: str. An ONNX file from this module.
        threads: int. Intra-op threads (inter-op: 1).
    """

    def __init__(self, path, threads):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            path, options, providers=["CPUExecutionProvider"]
        )
        self.threads = threads

    def run(self, features, names):
        """Outputs `names` (a dict) for a dict of int32 `(batch, length)` arrays."""
        feed = {name: np.asarray(features[name], np.int32) for name in ENCODER_INPUTS}
        return dict(zip(names, self.session.run(list(names), feed)))
