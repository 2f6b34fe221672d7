"""The words of the synthetic world.

Every attribute word is a single token of the BERT uncased WordPiece vocabulary (checked by
``tests/test_synth.py``), so that masked-language modelling on a caption hides a whole concept
and a region↔word alignment is one-to-one. Plurals and the out-of-domain filler text may split
into several word pieces; they never carry an attribute on their own.
"""

from __future__ import annotations

# Detector classes (index i here is detector class i + 1; class 0 is background). Each has a
# glyph in render.py. Visually similar pairs are listed in CONFUSABLE: the simulated detector
# mixes them up more often, as a real detector confuses look-alike classes.
CLASSES = ("ball", "box", "cone", "ring", "star", "cross", "diamond", "heart",
           "moon", "egg", "arrow", "house", "tree", "cup", "flag", "bell")
PLURALS = {c: c + ("es" if c.endswith(("x", "ss")) else "s") for c in CLASSES}
CONFUSABLE = {"ball": "egg", "egg": "ball", "box": "house", "house": "box", "cone": "tree",
              "tree": "cone", "diamond": "star", "star": "diamond", "cup": "bell",
              "bell": "cup", "flag": "arrow", "arrow": "flag", "ring": "moon",
              "moon": "ring", "cross": "star", "heart": "diamond"}

# Colour words with the RGB (0..1) they are rendered in; nearby colours (red/orange/pink,
# gray/white) are the ones the perceived colour noise confuses.
COLOURS = {
    "red": (0.85, 0.12, 0.12), "orange": (0.95, 0.55, 0.10), "yellow": (0.95, 0.88, 0.15),
    "green": (0.15, 0.65, 0.20), "blue": (0.15, 0.30, 0.85), "purple": (0.55, 0.20, 0.70),
    "pink": (0.95, 0.55, 0.70), "brown": (0.50, 0.30, 0.12), "black": (0.08, 0.08, 0.08),
    "white": (0.96, 0.96, 0.96), "gray": (0.55, 0.55, 0.55),
}
COLOUR_NAMES = tuple(COLOURS)
# Annotators' slips: the colour a VQA annotator names instead (and the spelling variant).
COLOUR_SLIPS = {"red": ("orange", "pink"), "orange": ("red", "yellow"), "yellow": ("orange",),
                "green": ("blue",), "blue": ("purple", "green"), "purple": ("blue", "pink"),
                "pink": ("red", "purple"), "brown": ("orange", "black"), "black": ("gray",),
                "white": ("gray",), "gray": ("grey", "white", "black")}

# Size words: fraction of the image side an object's longer side spans.
SIZES = {"small": 0.17, "medium": 0.25, "large": 0.34}
SIZE_NAMES = tuple(SIZES)

# Materials, rendered as textures: metal = shiny gradient, wooden = grain stripes,
# plastic = flat fill, glass = translucent with an outline.
MATERIALS = ("metal", "wooden", "plastic", "glass")
MATERIAL_ANSWERS = {"metal": "metal", "wooden": "wood", "plastic": "plastic", "glass": "glass"}

# Spatial relations: canonical name → surface forms used in text ("{a} <form> {b}").
RELATIONS = {
    "left": ("to the left of", "left of"),
    "right": ("to the right of", "right of"),
    "above": ("above", "over"),
    "below": ("below", "under"),
    "next": ("next to", "beside", "near"),
}
OPPOSITE = {"left": "right", "right": "left", "above": "below", "below": "above"}
# Words a RefCOCO+ expression must never contain (appearance only, no location).
SPATIAL_WORDS = frozenset({"left", "right", "above", "below", "over", "under", "next", "beside",
                           "near", "top", "bottom", "behind", "front", "middle", "center",
                           "corner", "side", "closest", "farthest", "first", "second", "third"})

# Out-of-domain alt-text replaces nouns by hypernyms and adds web boilerplate.
HYPERNYMS = ("object", "thing", "toy", "shape", "item")
VAGUE_COLOURS = ("colorful", "bright", "dark")
NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven")

# Predicates a picture cannot verify: SNLI-VE "neutral" hypotheses.
UNVERIFIABLE = ("is expensive", "is new", "is old", "is cheap", "belongs to a child",
                "was bought yesterday", "is a gift", "is for sale")

# Alt-text unrelated to its image (CC/SBU noise the curation feature must learn to remove).
UNRELATED_TEXT = (
    "free shipping on all orders over fifty dollars", "my trip to the beach last summer",
    "happy birthday to my best friend", "view from the hotel window at night",
    "the best pizza in town", "click here to read more", "a man riding a bike down the street",
    "sunset over the mountains", "our new kitchen after the renovation",
    "two dogs playing in the snow", "wedding party at the old church",
    "the team celebrates the victory", "traffic on the highway this morning",
    "a cup of coffee and a good book", "fresh vegetables at the farmers market",
    "page 12 of the annual report", "cute cat sleeping on the sofa",
    "breaking news from the city council", "a bowl of soup on a rainy day",
    "flowers in the garden after the rain",
)
CC_PREFIXES = ("", "", "", "illustration of ", "stock photo of ", "vector image of ",
               "a photo of ", "3d render of ", "cartoon of ")
SBU_OPENERS = ("my ", "look at this ", "found this ", "i love this ", "our ", "just a ")
SBU_ENDINGS = ("", "", " today", " on the table", " in my room", " :)", " at the shop", "!")


def article(word: str) -> str:
    """'a' or 'an' for the word that follows."""
    return "an" if word[0] in "aeiou" else "a"


def with_article(phrase: str) -> str:
    return f"{article(phrase)} {phrase}"


def all_attribute_words() -> list[str]:
    """Every single-token word the world uses to name a concept."""
    words = list(CLASSES) + list(COLOURS) + list(SIZES) + list(MATERIALS)
    words += list(MATERIAL_ANSWERS.values()) + list(HYPERNYMS) + list(NUMBER_WORDS)
    words += ["left", "right", "above", "below", "over", "under", "next", "beside", "near"]
    return sorted(set(words))
