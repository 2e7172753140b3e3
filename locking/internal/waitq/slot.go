package waitq

import "strings"

// slots is the number of Redis Cluster hash slots.
const slots = 16384

// slot is the Redis Cluster hash slot of key (or of a shard channel): the
// CRC16 (XMODEM) of its hash tag, the part between the first "{" and the
// next "}" if that is not empty, or else of the whole key, modulo 16384. A
// MOVED reply names the slot, not the channel it answers.
func slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % slots
}
