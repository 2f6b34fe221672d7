"""Batch keys the downstream adapters add to the batch contract (labels and bookkeeping).

Rows of a batch are *sequences* (text + image(s)); several rows can form one example:
NLVR2's pair variants (2 rows: left, right), VCR (4 rows: the choices), retrieval finetuning
(1 positive + negatives). ``num_examples`` counts examples, not rows.
"""

LABELS = "labels"                # long [E] class / region / choice index of each example
TARGETS = "targets"              # float [E, A] VQA soft scores over the answer vocabulary
EXAMPLE_INDEX = "example_index"  # long [E] row of the task table (evaluation: predictions)
GROUP_SIZE = "group_size"        # long [] rows per example (pair: 2, VCR: 4, retrieval: 1+k+k)
IMAGE_NEGATIVES = "image_negatives"  # long [] retrieval: negatives with another image per group
TEXT_NEGATIVES = "text_negatives"    # long [] retrieval: negatives with another text per group
ANSWER_POSITION = "answer_position"  # long [E] VQA from a token: the text position of the
                                 #   appended [MASK] whose output is classified (VL-BERT)
HARD_KEEP = "hard_keep"          # long [] retrieval: of each side's candidates keep the top k
                                 #   (0 = use all: random negatives)
MATCH_LABELS = "match_labels"    # float [E, G] retrieval in-batch groups: 1 where the row's
                                 #   caption belongs to the row's image (SOHO §4.2.1)

LABEL_KEYS = (LABELS, TARGETS, EXAMPLE_INDEX, GROUP_SIZE, IMAGE_NEGATIVES, TEXT_NEGATIVES,
              HARD_KEEP, ANSWER_POSITION, MATCH_LABELS)
