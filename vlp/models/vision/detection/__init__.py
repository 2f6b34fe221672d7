"""Detection ops (NMS, RoIAlign, box coder, anchors, RPN) and the BUTD detector, in plain torch."""
