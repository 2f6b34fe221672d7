"""The batch contract between the data pipeline (``vlp.datasets``) and the models (``vlp.models``).

A batch is a ``dict[str, torch.Tensor]`` produced by the pipeline's collate and consumed by
``model(batch, task=...)``. One batch serves one pretraining task (UNITER's conditional
masking: the train loop draws the task, the pipeline masks for it). Text and regions arrive
padded *separately*; the model packs them (UNITER: text then regions, no interior padding).

Keys marked (task) appear only in batches of the tasks that need them. Sizes:
B = examples (text–image pairs), T = text length incl. [CLS]/[SEP], N = regions,
D = region feature width, C = detector classes (index 0 = background), L = location width.
"""

# ---- text (every family) -------------------------------------------------------------
INPUT_IDS = "input_ids"            # long [B, T]  [CLS] w1 … wk [SEP] then [PAD]=0
TEXT_MASK = "text_mask"            # long [B, T]  1 = real token (CLS/SEP included)
MLM_LABELS = "mlm_labels"          # long [B, T]  (mlm) original id at masked positions,
                                   #   -100 elsewhere

# ---- regions (uniter / vlbert / imagebert families) ------------------------------------
REGION_FEATS = "region_feats"      # half [B, N, D] model input: masked rows already zeroed.
                                   #   Region features, their targets and soft labels stay
                                   #   fp16 as stored (half the host bytes and host→device
                                   #   copy); the train loop casts floats to its dtype on the
                                   #   device, the models cast what they read
REGION_LOC = "region_loc"          # float [B, N, L] UNITER 7-d [x1,y1,x2,y2,w,h,w*h] normalised;
                                   #   ImageBERT 5-d [x1/W,y1/H,x2/W,y2/H,area ratio];
                                   #   VL-BERT 4-d normalised box [x1,y1,x2,y2] (model adds sine)
REGION_MASK = "region_mask"        # long [B, N]  1 = real region
REGION_MASKED = "region_masked"    # bool [B, N]  (region tasks) positions whose loss is computed
REGION_ZEROED = "region_zeroed"    # bool [B, N]  (region tasks) rows replaced at the input
                                   #   (zeroed; families with a learned mask embedding add it
                                   #   here). MOC keeps 10% of masked rows: masked but not zeroed.
REGION_FEAT_TARGETS = "region_feat_targets"  # half [B, N, D] (mrfr) raw features before masking
REGION_SOFT_LABELS = "region_soft_labels"    # half [B, N, C] (mrc-kl, mrc-vlbert) detector
                                             #   distribution
REGION_CLASS_LABELS = "region_class_labels"  # long [B, N] (mrc, moc, mrc-vlbert) argmax over
                                             #   classes 1..C-1 (background excluded); -100
                                             #   where not masked
IMAGE_FEAT = "image_feat"          # float [B, D] (vlbert) whole-image feature: the shard's
                                   #   whole-image RoI; the mean of the regions NOT masked
                                   #   where it has none or RoIs are masked (no leak)

# ---- image–text matching -------------------------------------------------------------
ITM_LABELS = "itm_labels"          # long [B] (itm) 1 = matched pair, 0 = swapped negative
POSITIVE = "positive"              # bool [B] 1 = the pair is a true pair; masked-modeling
                                   #   losses are computed on positive pairs only

# ---- pixels (soho family) ------------------------------------------------------------
PIXELS = "pixels"                  # float [I, 3, H, W] normalised images, padded; I ≤ B images
PIXEL_MASK = "pixel_mask"          # long [I, H, W] 1 = real pixel
IMAGE_INDEX = "image_index"        # long [B] which row of PIXELS each example's text pairs with
                                   #   (an image is forwarded once even when paired with several
                                   #   texts: SOHO's 2 positive + 2 negative texts per image)
MVM_APPLY = "mvm_apply"            # bool [I] (mvm) images on which the model masks one
                                   #   dictionary index (chosen after the visual dictionary)

# ---- token types (optional; downstream tasks that extend the token-type table) ---------
TEXT_TYPE_IDS = "text_type_ids"    # long [B, T] token type of each text token (default 0);
                                   #   VCR: question 0, answer 2, rationale 3 (UNITER)
REGION_TYPE_IDS = "region_type_ids"  # long [B, N] token type of each region (default: the
                                     #   family's image type); NLVR2 triplet: 2nd image → 2

# ---- bookkeeping (every batch) -------------------------------------------------------
NUM_EXAMPLES = "num_examples"      # long [] examples in the batch
INPUT_UNITS = "input_units"        # long [] B × max_b(text_len_b + regions_b): UNITER's batch unit,
                                   #   the packed row the model computes on (pixels: B × (T + V))

# ---- what the model would otherwise read back from the device (pretraining batches) -----
# Computed by the collate on the host (``vlp.contract.batch_indices``), so the forward never
# waits for the device to learn a length or where the masked positions are.
ROW_LENGTH = "row_length"          # long [] max_b(text_len_b + regions_b): the packed row's
                                   #   length (pixels: T + the padded image's cells); the
                                   #   prefetcher hands it over as a Python int (never copied
                                   #   to the device)
MLM_TARGETS = "mlm_targets"        # long [2, M] (mlm) (row, column) of the text tokens whose
                                   #   MLM loss counts: masked, real, in a true pair; row-major
REGION_TARGETS = "region_targets"  # long [2, M] (region tasks) (row, column) of the regions
                                   #   whose loss counts: masked, real, in a true pair, and
                                   #   labelled where the batch has class labels; row-major
REAL_UNITS = "real_units"          # long [] the input units that are not padding: Σ_b text_len_b
                                   #   + regions_b (pixels: every grid cell counts); MFU on
                                   #   real tokens divides by these
HOST_INTS = (ROW_LENGTH, REAL_UNITS)          # host integers, never copied to the device

# ---- fixed shapes (``data.fixed_shapes``: vlp.datasets.batching.fixed_shapes) ------------
# A batch padded to one of a few shapes has padding rows and padding targets; the losses are
# means over the valid ones. Absent: every row and target is valid.
ROW_VALID = "row_valid"            # bool [B] False = a padding row (no loss, no label counts)
MLM_TARGET_VALID = "mlm_target_valid"        # bool [M] False = a padding entry of MLM_TARGETS
REGION_TARGET_VALID = "region_target_valid"  # bool [M] False = a padding entry of
                                             #   REGION_TARGETS

# ---- the summed objective (ImageBERT, SOHO) -------------------------------------------
TASK_BATCHES = "task_batches"      # {task: batch}: one example set, a batch per task (its own
                                   #   masking and ITM negatives); beside it the set's
                                   #   NUM_EXAMPLES and INPUT_UNITS, counted once

TEXT_KEYS = (INPUT_IDS, TEXT_MASK)
REGION_KEYS = (REGION_FEATS, REGION_LOC, REGION_MASK)
PIXEL_KEYS = (PIXELS, PIXEL_MASK, IMAGE_INDEX)
