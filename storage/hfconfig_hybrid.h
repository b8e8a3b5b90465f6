/* storage/hfconfig_hybrid.h — config.json of the Mamba-2 families (NemotronHForCausalLM,
 * model_type "nemotron_h"; Mamba2ForCausalLM and mamba_ssm's config, family "mamba2"), for
 * storage/hfconfig.c, which reads and writes every family's config.json.
 */
#ifndef AC_STORAGE_HFCONFIG_HYBRID_H
#define AC_STORAGE_HFCONFIG_HYBRID_H

#include <stddef.h>
#include <jansson.h>

#include "engine/arch.h"

/* 1 when the config (its class cls, else model_type, else mamba_ssm's d_model and ssm_cfg)
 * names Nemotron-H or Mamba-2, else 0. */
int hfconfig_hybrid_is(json_t *cfg, const char *cls, const char *model_type);

/* Parse a Nemotron-H or Mamba-2 config.json object (borrowed) into a (must not own memory; owns the
 * layers on success). The layer pattern comes from hybrid_override_pattern ("M" Mamba-2,
 * "*" attention, "-" MLP, "E" MoE) or layers_block_type; fields that change the math but
 * that the engine lacks (biases, other activations, dt clamps, MoE layers) are refused.
 * Returns 0, or -1 with "config.json: field: reason" in err and nothing to free. */
int hfconfig_hybrid_to_arch(json_t *cfg, arch *a, char *err, size_t errlen);

/* config.json of a mamba2 arch (Mamba2ForCausalLM: one Mamba shape), or of a nemotron_h arch: every Mamba layer of one shape, every attention layer
 * of one head count, every MLP of one width (else NULL with the reason). NEW reference. */
json_t *hfconfig_hybrid_from_arch(const arch *a, const char *torch_dtype, char *err, size_t errlen);

#endif
