"""Describe a real ``nn.Module`` as a shardwise :class:`~shardwise.wire.spec.ModelSpec`, without allocating its weights.

Build the model on the meta device (``with torch.device("meta"): model = MyModel()``) and call
:func:`describe`; nothing is materialised, so a model with a 1 TB table is described in milliseconds. What becomes
what, walking the module tree from the root:

* ``nn.EmbeddingBag`` → a table named by its FQN: rows, dim, dtype of the weight, pooling ``sum`` / ``mean`` from
  its mode (mode ``max`` is refused: shardwise's cost model and executors know sum and mean pooling only);
* ``nn.Embedding`` → a sequence table: pooling ``none`` (one output row per id), ``num_features`` the number of
  times the example forward calls it (one table serving a user's history and the candidates is two features);
* TorchRec's ``EmbeddingBagCollection`` / ``EmbeddingCollection`` (and any module implementing their interfaces),
  when TorchRec is in use → one table per config, named by the config (TorchRec plans key tables by that name),
  ``num_features`` = the config's feature count (a feature several tables share counts in each), pooling from the
  config (``none`` for an EmbeddingCollection), ``weighted`` when the collection is (per-id weights travel with the
  ids); the collection's own ``nn.EmbeddingBag`` / ``nn.Embedding`` are those tables, and anything else in it that
  holds parameters (a feature processor) is described by the next two rules;
* ``nn.Linear`` → a ``linear`` dense layer with its forward FLOPs per sample counted by
  ``torch.utils.flop_counter`` on meta tensors (a meta copy of the parameters when the layer has real ones, so no
  real compute runs);
* any other module that holds parameters of its own (``nn.Parameter`` attributes, or an ``nn.ParameterList`` /
  ``nn.ParameterDict`` child — DLRM_DCN's cross network, a norm, ``nn.MultiheadAttention``) → one ``unclassified``
  dense layer named by its FQN, covering the whole subtree (so the layers of a plan never nest): its parameter
  count, its activation bytes (input and output per sample) and its forward FLOPs (FlopCounterMode on meta). It
  runs ``replicate`` or ``fsdp`` (``dense_styles`` pins one). A module that holds parameters of its own *and*
  embedding tables below it cannot be one layer (a layer holds no table): each of its own parameters becomes an
  unclassified layer named by the parameter's FQN, pinned to ``replicate`` (``apply_plan`` all-reduces the gradient
  of such a parameter), and its children are described by these rules.

**Every parameter is accounted for.** After the walk, the described parameters must equal the module's — count and
bytes, each parameter covered once — or :func:`describe` raises ``ValueError`` naming the modules left out (or the
layers that share a parameter). Nothing is dropped silently.

**Tied weights.** An ``nn.Linear`` whose weight is a table's (an output head scoring every item with the item
embedding, SASRec and BERT4Rec style) is described as one table and a head: the weight once, in the table; the head
an unclassified layer holding its bias alone (``param_count`` 0 without one) whose FLOPs are the GEMM it runs, priced
as any dense layer. A table whose weight the forward reads otherwise (``F.linear(x, emb.weight)``) is found in the
example forward; that product's FLOPs are spent outside every layer (below). Either way :func:`describe` warns: the
planner prices the table's update from its lookups alone, though the head's gradient reaches every row it scores each
step, and ``apply_plan`` cannot run such a table sharded. Other shared parameters are refused.

**FLOPs.** Without ``example_inputs``, each layer is counted alone: an ``nn.Linear`` on ``(in_features,)`` (or its
``input_shapes`` entry), an unclassified layer on its ``input_shapes`` entry (a norm's input shape is known from the
norm; an ``nn.MultiheadAttention`` takes ``(seq_len, embed_dim)`` and attends it to itself); one whose input cannot
be known is an error that names it. With ``example_inputs`` (the arguments of ``module.forward``: tensors and
TorchRec ``KeyedJaggedTensor`` s, copied to the meta device), :func:`describe` runs the real forward once on meta
under ``FlopCounterMode``; each FLOP goes to the innermost layer running when it is spent, else to the innermost
module running, so a FLOP is counted once however the modules nest (``nn.TransformerEncoder`` holds its layers in
an ``nn.ModuleList`` it never calls). FLOPs spent outside every layer (DLRM's feature interaction, attention in a
parameterless block such as HSTU's pointwise attention) become a parameterless unclassified layer named by the
module that spends them, so the spec's FLOPs are the forward's. Attention over padded sequences is counted padded,
as the forward computes it.

**Attention over jagged lengths.** Where the forward pads its sequences, :func:`hstu_attention` (``attention``) gives
the attention's layer by a stated formula over the samples' own lengths (``Q·Kᵀ`` and ``A·V``, ``2·P·d`` FLOPs each
for the ``P`` query-key pairs a sample scores, causal or not, averaged over the samples) and ``describe(...,
extra_layers=[hstu_attention("block", lengths, dim)])`` puts it in place of the parameterless layer the forward
counted padded (``block``, the module that spent those FLOPs), or beside the others under a new name.

**Sequence tables.** A step's lookups follow its sequences' lengths, and a step waits for its longest sequences:
a sequence table (pooling ``none``) gets its mean ids per sample per feature (``pooling_factor``) and their 99th
percentile (``pooling_factor_p99``, nearest rank), given, measured from ``sample_batch``, or else from
``example_inputs``: the ids each call of an ``nn.Embedding`` looks up (those equal to its ``padding_idx`` left out
where the call gets an example tensor unchanged; computed ids are counted whole, with a warning when a
``padding_idx`` is set), over the example's samples; an ``EmbeddingCollection``'s from the example's
``KeyedJaggedTensor``. 1-D ids (jagged values) give the mean alone. The example's sequences are those the dense
part's FLOPs were counted on, so lookups and attention agree; a pooled table's factor is not taken from the example
(its bags shape no FLOPs, and are often made up to run the forward): pass ``sample_batch`` or ``pooling_factors``.

**Statistics from a real batch.** ``sample_batch`` — a ``KeyedJaggedTensor``, or a mapping feature → ``(ids,
offsets)`` with ``offsets`` of ``batch`` entries (the bag starts, as ``nn.EmbeddingBag`` takes them) or ``batch + 1``
(the starts and the end) — measures each table's pooling
factor (ids per sample per feature, over the features that feed it), a sequence table's 99th percentile of them, and
its access skew (the Zipf exponent of its row accesses, for the cache; :func:`zipf_exponent`). For TorchRec
collections the features are the configs' ``feature_names``; for ``nn.EmbeddingBag`` / ``nn.Embedding`` the feature
is the table's FQN (an ``nn.Embedding`` called k times a sample: k bags a sample). Values passed explicitly
(``pooling_factors``, ``pooling_factors_p99``, ``access_skew``) win over the measured ones, and a sample batch's over
an example's.

The walk is ``walk``, the FLOPs ``flops``, the batch statistics ``batch``, the attention formula ``attention`` and the
entry point ``spec``. torch is imported lazily; these modules otherwise import the wire models only.
"""

from __future__ import annotations

from shardwise.runtime.describe.attention import hstu_attention
from shardwise.runtime.describe.batch import zipf_exponent
from shardwise.runtime.describe.spec import describe

__all__ = ["describe", "hstu_attention", "zipf_exponent"]
