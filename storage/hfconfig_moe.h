/* storage/hfconfig_moe.h — config.json of the mixture-of-experts families (Mixtral,
 * Qwen2-MoE), for storage/hfconfig.c, which reads and writes every family's config.json.
 */
#ifndef AC_STORAGE_HFCONFIG_MOE_H
#define AC_STORAGE_HFCONFIG_MOE_H

#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#include "engine/arch.h"

/* hfconfig_moe_family: 1 Mixtral, 2 Qwen2-MoE, 3 OLMoE, 0 none (by architectures[0], else model_type).
 * hfconfig_moe_default: the family's default of "rms_norm_eps", "max_position_embeddings" or
 * "rope_theta" (transformers' config classes; the Llama reader's are 1e-6, 2048 and 10000).
 * hfconfig_moe_layers: sets a's family and each layer's attention (H query, KV key/value heads)
 * and MLP (dense or MoE) from the family's fields or from block_configs (a has n_layers
 * layers with source_layer set). 0, or -1 with err.
 * hfconfig_moe_from_arch: config.json of an MoE-family arch (block_configs when its layers
 * differ). NEW reference, or NULL with err. */
int hfconfig_moe_family(const char *cls, const char *model_type);
double hfconfig_moe_default(int fam, const char *field);
int hfconfig_moe_layers(json_t *cfg, int fam, arch *a, int64_t H, int64_t KV, char *err, size_t errlen);
json_t *hfconfig_moe_from_arch(const arch *a, const char *torch_dtype, char *err, size_t errlen);

#endif
