"""Initializer helpers."""

import keras


def clone_initializer(initializer):
    """A fresh copy of `initializer` for one variable.

    Keras 3 fixes an unseeded initializer's seed when the instance is made, so
    one instance shared by several layers gives them all the same values (every
    layer's query, key and value kernels would start equal). Each variable gets
    its own copy.
    """
    initializer = keras.initializers.get(initializer)
    return initializer.__class__.from_config(initializer.get_config())
