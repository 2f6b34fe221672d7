"""The contract every layer shares, with no heavy imports of its own: the batch keys
(``batch_spec``, ``downstream_keys``), checks on a batch (``batch_access``), what the backbone
hands to heads (``encoder_output``) and the typed configs on pydantic (``config_loader``, with
vlp's one-line errors in ``config_errors``).

Everything in vlp may import from here; nothing here imports from the rest of vlp.
"""
