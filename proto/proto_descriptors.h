/* The serialized google.protobuf.FileDescriptorSet of every .proto in proto/ (deltaserve.v1,
 * grpc.health.v1, grpc.reflection.v1 and v1alpha), imports included, embedded at build time
 * by //proto:descriptor_set_gen for server reflection. Read-only, static lifetime. */
#ifndef DS_PROTO_PROTO_DESCRIPTORS_H
#define DS_PROTO_PROTO_DESCRIPTORS_H

#include <stddef.h>

extern const unsigned char proto_descriptors_data[]; /* static, [proto_descriptors_bytes] */
extern const size_t proto_descriptors_bytes;

#endif
