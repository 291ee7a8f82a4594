"""The one place that assembles a run from a config: training (``train``), its model card
(``card``), ablations (``ablation``) and hint-uplift studies (``uplift``, ``uplift_turns``)."""
