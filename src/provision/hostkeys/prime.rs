//! The RSA host key's primes. rsa's own search (a port of Go's `crypto/rand.Prime`) takes a
//! random odd number with its top two bits set, moves it up to the next number with no prime
//! factor below 64 and runs the full primality test on that one candidate; about 145
//! candidates per 1536-bit prime fail that test, each costing a modular exponentiation. This
//! search is the same but moves up to the next number with no prime factor below
//! `SIEVE_BELOW` and none that makes e and p - 1 share a factor, so about 70 candidates reach
//! the test. The test is crypto-primes' `is_prime_with_rng` in crypto-bigint's Montgomery
//! arithmetic: Miller-Rabin to base 2 (which nearly every composite fails, for the cost of one
//! exponentiation), a strong Lucas test (the two are Baillie-PSW) and Miller-Rabin to a random
//! base, as rsa 0.10's own generation asks; the key is assembled and validated by rsa
//! (`from_primes`, d from Euler's totient as rsa's own generation computes it).

use crypto_bigint::{Encoding, Uint};
use num_bigint_dig::BigUint;
use rand_core::CryptoRngCore;
use rsa::RsaPrivateKey;

/// The candidates carry no odd prime factor below this: past it each new candidate's residues
/// cost more than the tests a larger sieve saves (docs/performance.md).
const SIEVE_BELOW: u32 = 8192;
/// 65537, as ssh-keygen and rsa use.
const PUBLIC_EXPONENT: u32 = 65537;
/// How far above its random start a candidate may be (Go's and rsa's bound).
const DELTA_LIMIT: u32 = 1 << 20;

/// An RSA key from two primes of `LIMBS` limbs each (an RSA-3072 key's are `U1536`'s); None
/// once `stopped` says so (asked before each candidate).
pub fn rsa_key<const LIMBS: usize>(
    rng: &mut impl CryptoRngCore,
    stopped: &dyn Fn() -> bool,
) -> Option<rsa::Result<RsaPrivateKey>>
where
    Uint<LIMBS>: Encoding,
{
    let sieve = Sieve::new();
    loop {
        let p = sieve.prime::<LIMBS>(rng, stopped)?;
        let q = sieve.prime::<LIMBS>(rng, stopped)?;
        // Both have their top two bits set, so n has exactly twice their bits; p == q is a
        // 2^-1500 event that from_primes refuses anyway.
        if p != q {
            let e = BigUint::from(PUBLIC_EXPONENT);
            return Some(RsaPrivateKey::from_primes(vec![p, q], e));
        }
    }
}

/// The odd primes below `SIEVE_BELOW`, in pairs whose product fits a u32, so that one pass of
/// divisions over a candidate gives its residue modulo both.
struct Sieve {
    primes: Vec<u32>,
    pairs: Vec<u64>,
}

impl Sieve {
    fn new() -> Sieve {
        let primes: Vec<u32> = (3..SIEVE_BELOW)
            .step_by(2)
            .filter(|&k| {
                (3..)
                    .step_by(2)
                    .take_while(|d| d * d <= k)
                    .all(|d| k % d != 0)
            })
            .collect();
        let pairs = primes
            .chunks(2)
            .map(|c| c.iter().map(|&p| u64::from(p)).product())
            .collect();
        Sieve { primes, pairs }
    }

    /// A probable prime of `LIMBS` limbs with its top two bits set; None once `stopped` says
    /// so.
    fn prime<const LIMBS: usize>(
        &self,
        rng: &mut impl CryptoRngCore,
        stopped: &dyn Fn() -> bool,
    ) -> Option<BigUint>
    where
        Uint<LIMBS>: Encoding,
    {
        let mut start = Uint::<LIMBS>::ZERO.to_be_bytes();
        loop {
            if stopped() {
                return None;
            }
            rng.fill_bytes(start.as_mut());
            // None when the top two bits were carried out (the start was within DELTA_LIMIT of
            // the top): another start
            let Some(p) = self.candidate(start.as_mut()) else {
                continue;
            };
            if crypto_primes::is_prime_with_rng(rng, &p) {
                return Some(BigUint::from_bytes_be(p.to_be_bytes().as_ref()));
            }
        }
    }

    /// The first number at or above `start` (big-endian, `LIMBS` limbs; its top two bits and
    /// its low bit set first) that no sieve prime divides and that is not 1 modulo the public
    /// exponent, with its top two bits still set; None when there is none within
    /// `DELTA_LIMIT`.
    fn candidate<const LIMBS: usize>(&self, start: &mut [u8]) -> Option<Uint<LIMBS>>
    where
        Uint<LIMBS>: Encoding,
    {
        *start.first_mut()? |= 0xc0;
        *start.last_mut()? |= 1;
        let mut residues = Vec::with_capacity(self.primes.len());
        for (pair, &m) in self.primes.chunks(2).zip(&self.pairs) {
            let r = residue(start, m);
            residues.extend(pair.iter().map(|&p| (r % u64::from(p)) as u32));
        }
        let e = residue(start, u64::from(PUBLIC_EXPONENT)) as u32;
        let delta = (0..DELTA_LIMIT).step_by(2).find(|&d| {
            (e + d) % PUBLIC_EXPONENT != 1
                && self
                    .primes
                    .iter()
                    .zip(&residues)
                    .all(|(&p, &r)| (r + d) % p != 0)
        })?;
        // the top two bits stay set unless the sum carried out of them
        let c = Uint::<LIMBS>::from_be_slice(start).wrapping_add(&Uint::from_u32(delta));
        let top = Uint::<LIMBS>::BITS;
        (c.bit_vartime(top - 1) && c.bit_vartime(top - 2)).then_some(c)
    }
}

/// The big-endian number `bytes` modulo `m` (below 2^32).
fn residue(bytes: &[u8], m: u64) -> u64 {
    bytes.chunks(4).fold(0, |r, chunk| {
        let word = chunk.iter().fold(0u64, |w, &b| w << 8 | u64::from(b));
        (r << (8 * chunk.len()) | word) % m
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crypto_bigint::{U1536, U512};
    use num_bigint_dig::prime::probably_prime;
    use rand_core::{CryptoRng, RngCore};
    use rsa::traits::{PrivateKeyParts, PublicKeyParts};

    /// A fixed byte stream, so the search is repeatable (marked CryptoRng only because the
    /// search asks for one).
    struct Counter(u64);

    impl CryptoRng for Counter {}

    fn big<const LIMBS: usize>(n: &Uint<LIMBS>) -> BigUint
    where
        Uint<LIMBS>: Encoding,
    {
        BigUint::from_bytes_be(n.to_be_bytes().as_ref())
    }

    impl RngCore for Counter {
        fn next_u32(&mut self) -> u32 {
            self.next_u64() as u32
        }
        fn next_u64(&mut self) -> u64 {
            // splitmix64
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            for b in dest.chunks_mut(8) {
                b.copy_from_slice(&self.next_u64().to_le_bytes()[..b.len()]);
            }
        }
        fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
            self.fill_bytes(dest);
            Ok(())
        }
    }

    #[test]
    fn the_sieve_holds_the_odd_primes_below_its_bound() {
        let s = Sieve::new();
        // pi(8192) = 1028, less the prime 2
        assert_eq!(s.primes.len(), 1027);
        assert_eq!(&s.primes[..5], &[3, 5, 7, 11, 13]);
        assert_eq!(s.primes.last(), Some(&8191));
        assert_eq!(s.pairs[0], 15);
        assert!(s.pairs.iter().all(|&m| m < 1 << 32));
    }

    #[test]
    fn residues_agree_with_bigint_division() {
        let mut rng = Counter(7);
        for len in [1, 3, 4, 5, 192] {
            let mut bytes = vec![0u8; len];
            rng.fill_bytes(&mut bytes);
            let n = BigUint::from_bytes_be(&bytes);
            for m in [3u64, 65537, 15, 8191 * 8179, u32::MAX as u64] {
                assert_eq!(BigUint::from(residue(&bytes, m)), &n % m, "len {len} m {m}");
            }
        }
    }

    #[test]
    fn a_candidate_is_the_first_number_the_sieve_and_the_exponent_let_through() {
        let s = Sieve::new();
        let e = BigUint::from(PUBLIC_EXPONENT);
        let mut rng = Counter(1);
        for _ in 0..20 {
            let mut start = vec![0u8; 64];
            rng.fill_bytes(&mut start);
            let c = big(&s.candidate::<{ U512::LIMBS }>(&mut start).unwrap());
            let from = BigUint::from_bytes_be(&start);
            assert_eq!(start[0] & 0xc0, 0xc0);
            assert_eq!(&from % 2u32, BigUint::from(1u32));
            let passes = |n: &BigUint| {
                s.primes.iter().all(|&p| (n % p) != BigUint::from(0u32))
                    && n % &e != BigUint::from(1u32)
            };
            assert!(passes(&c));
            let mut n = from;
            while n < c {
                assert!(!passes(&n), "{n} was let by");
                n += 2u32;
            }
        }
    }

    #[test]
    fn a_number_one_above_a_multiple_of_the_exponent_is_passed_over() {
        // the first n = 65537 k + 1 above a 512-bit start that the sieve alone lets through:
        // p - 1 would share the factor 65537 with e
        let s = Sieve::new();
        let sieved = |n: &BigUint| s.primes.iter().all(|&p| n % p != BigUint::from(0u32));
        let mut k = (BigUint::from(3u32) << 510) / PUBLIC_EXPONENT;
        k += 2u32 - (&k % 2u32); // even k: n odd
        let n = loop {
            let n = &k * PUBLIC_EXPONENT + 1u32;
            if sieved(&n) {
                break n;
            }
            k += 2u32;
        };
        let mut bytes = n.to_bytes_be();
        let c = big(&s.candidate::<{ U512::LIMBS }>(&mut bytes).unwrap());
        assert_eq!(
            BigUint::from_bytes_be(&bytes),
            n,
            "the start already had its bits set"
        );
        assert!(c > n);
        assert!(sieved(&c));
        assert_ne!(&c % PUBLIC_EXPONENT, BigUint::from(1u32));
    }

    #[test]
    fn the_verdict_agrees_with_rsa_s_on_the_candidates() {
        // sieved 1536-bit candidates: crypto-primes' Baillie-PSW and rsa's 21 Miller-Rabin
        // rounds and Lucas test find the same primes among them
        let s = Sieve::new();
        let mut rng = Counter(7);
        let (mut primes, mut composites) = (0, 0);
        while primes < 2 || composites < 20 {
            let mut start = vec![0u8; 192];
            rng.fill_bytes(&mut start);
            let c = s.candidate::<{ U1536::LIMBS }>(&mut start).unwrap();
            let prime = probably_prime(&big(&c), 20);
            assert_eq!(crypto_primes::is_prime_with_rng(&mut rng, &c), prime, "{c}");
            if prime {
                primes += 1;
            } else {
                composites += 1;
            }
        }
    }

    #[test]
    fn a_candidate_carried_out_of_its_top_bits_is_none() {
        // all ones: every number above it within the limit wraps past 2^512
        let mut start = vec![0xffu8; 64];
        assert!(Sieve::new()
            .candidate::<{ U512::LIMBS }>(&mut start)
            .is_none());
    }

    #[test]
    fn a_stopped_search_ends_before_its_next_candidate() {
        let asked = std::cell::Cell::new(0);
        let stopped = || {
            asked.set(asked.get() + 1);
            asked.get() > 3
        };
        assert!(rsa_key::<{ U1536::LIMBS }>(&mut Counter(5), &stopped).is_none());
        assert_eq!(asked.get(), 4);
    }

    #[test]
    fn a_key_is_made_of_two_primes_of_half_its_size() {
        let key = rsa_key::<{ U512::LIMBS }>(&mut Counter(42), &|| false)
            .unwrap()
            .unwrap();
        assert_eq!(key.n().bits(), 1024);
        assert_eq!(key.e(), &BigUint::from(PUBLIC_EXPONENT));
        let primes = key.primes();
        assert_eq!(primes.len(), 2);
        for p in primes {
            assert_eq!(p.bits(), 512);
            assert!(probably_prime(p, 20));
            assert_ne!(p % PUBLIC_EXPONENT, BigUint::from(1u32));
        }
        assert_eq!(&primes[0] * &primes[1], *key.n());
        key.validate().unwrap();
    }
}
