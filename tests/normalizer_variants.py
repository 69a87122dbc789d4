"""Option variants the normalizer tests draw besides each YAML's defaults (optional: a normalizer missing here is
checked at its defaults only)."""

VARIANTS = {
    "softmax": {
        "default": {},
        "beta0.7-shared": {"beta": 0.7, "per_head": False},
        "adaptive-eval": {"adaptive_temperature": "eval"},
    },
    "kl": {
        "uniform": {"prior": "uniform"},
        "recency": {"prior": "recency", "slope": 0.3},
        "learned": {"prior": "learned", "max_distance": 4},
        "recency-adaptive": {"prior": "recency", "slope": 0.3, "adaptive_temperature": "eval"},
    },
    "softmax1": {"default": {}},
    "sigmoid": {"default": {}, "bias-1.5": {"bias": -1.5}},
    "relu": {"default": {}},
    "squared": {
        "plain": {},
        "offset": {"offset": True},
        "eps0": {"eps": 0.0},
        "eps0.1": {"eps": 0.1},
        "power3": {"power": 3},
        "offset-power4": {"offset": True, "power": 4},
    },
    # favor with F = H shares compiled shapes with elu1 (F ≠ H and several chunk sizes are
    # covered by test_linear_attention_forms_agree)
    "linear": {"elu1": {}, "relu": {"feature_map": "relu"}, "favor": {"feature_map": "favor", "num_features": 5}},
    "entmax": {"alpha1.5": {"alpha": 1.5}, "alpha2": {"alpha": 2.0}, "alpha1.3": {"alpha": 1.3}},
    "ssmax": {"default": {}, "s1.5-bias": {"s": 1.5, "bias": True, "beta": 0.6}},
    "stickbreaking": {"default": {}, "attend_current-beta1": {"attend_current": True, "beta": 1.0}},
    "softpick": {"default": {}, "beta2-softcap1.5": {"beta": 2.0, "softcap": 1.5}, "eps0": {"eps": 0.0}},
    "sink": {
        "default": {},
        "fixed-1.5": {"sink": -1.5, "learnable_sink": False},
        "sink2-softcap2": {"sink": 2.0, "softcap": 2.0},
    },
    # at layer 3 in the checker (takes_layer_index: λ_init from the schedule), 0 elsewhere; λ_init fixed; a soft cap
    "differential": {
        "default": {},
        "fixed0.5-beta1": {"lambda_init": 0.5, "learnable_lambda": False, "beta": 1.0},
        "softcap2": {"softcap": 2.0},
    },
    # without a layer input (the shared checks pass none): the gate σ(b_f) at every position
    "forgetting": {"default": {}, "gate2-beta1": {"gate_bias": 2.0, "beta": 1.0}, "softcap1": {"softcap": 1.0}},
}
