// Clang's thread-safety attributes, so that which lock guards which member,
// and which functions need a lock held or not held, is checked by the
// compiler (-Wthread-safety, on in clang builds: GPUCKPT_THREAD_SAFETY)
// rather than stated in comments alone. Under other compilers they expand
// to nothing.
//
// Use them with the Mutex, MutexLock and CondVar of core/base/mutex.h:
//
//   Mutex mu_;
//   int count_ GUARDED_BY(mu_);          // read or written only with mu_ held
//   void Bump() REQUIRES(mu_);           // the caller holds mu_
//   void Flush() EXCLUDES(mu_);          // the caller must not hold mu_
//
// The attributes are Clang's (clang.llvm.org/docs/ThreadSafetyAnalysis.html);
// the names are the ones its documentation uses.
#ifndef GPUCKPT_CORE_BASE_THREAD_ANNOTATIONS_H_
#define GPUCKPT_CORE_BASE_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define GPUCKPT_THREAD_ATTRIBUTE(x) __attribute__((x))
#else
#define GPUCKPT_THREAD_ATTRIBUTE(x)
#endif

// A type whose objects are locks (`name` appears in the warnings).
#define CAPABILITY(name) GPUCKPT_THREAD_ATTRIBUTE(capability(name))
// An RAII type that holds a capability from its construction to its
// destruction (or its Unlock()).
#define SCOPED_CAPABILITY GPUCKPT_THREAD_ATTRIBUTE(scoped_lockable)

// Members: read or written only with the capability held (PT_: the object
// the pointer points to, not the pointer itself).
#define GUARDED_BY(x) GPUCKPT_THREAD_ATTRIBUTE(guarded_by(x))
#define PT_GUARDED_BY(x) GPUCKPT_THREAD_ATTRIBUTE(pt_guarded_by(x))

// Lock order: this capability is taken after / before the ones named.
#define ACQUIRED_AFTER(...) GPUCKPT_THREAD_ATTRIBUTE(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) GPUCKPT_THREAD_ATTRIBUTE(acquired_before(__VA_ARGS__))

// Functions: called with the capability held (exclusively or shared) and
// still held on return.
#define REQUIRES(...) GPUCKPT_THREAD_ATTRIBUTE(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) GPUCKPT_THREAD_ATTRIBUTE(requires_shared_capability(__VA_ARGS__))

// Functions that take or give back a capability (no argument: `this`).
#define ACQUIRE(...) GPUCKPT_THREAD_ATTRIBUTE(acquire_capability(__VA_ARGS__))
#define ACQUIRE_SHARED(...) GPUCKPT_THREAD_ATTRIBUTE(acquire_shared_capability(__VA_ARGS__))
#define RELEASE(...) GPUCKPT_THREAD_ATTRIBUTE(release_capability(__VA_ARGS__))
#define RELEASE_SHARED(...) GPUCKPT_THREAD_ATTRIBUTE(release_shared_capability(__VA_ARGS__))
#define RELEASE_GENERIC(...) GPUCKPT_THREAD_ATTRIBUTE(release_generic_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) GPUCKPT_THREAD_ATTRIBUTE(try_acquire_capability(__VA_ARGS__))

// Functions the caller must not call with the capability held: they take it
// themselves, or block on something whose owner needs it.
#define EXCLUDES(...) GPUCKPT_THREAD_ATTRIBUTE(locks_excluded(__VA_ARGS__))

// Functions that check at run time that the capability is held, after which
// the analysis assumes it is.
#define ASSERT_CAPABILITY(x) GPUCKPT_THREAD_ATTRIBUTE(assert_capability(x))

// Functions returning a reference to the capability named.
#define RETURN_CAPABILITY(x) GPUCKPT_THREAD_ATTRIBUTE(lock_returned(x))

// A function whose locking the analysis cannot follow (a lock held across
// an object's whole life, say); say why wherever it is used.
#define NO_THREAD_SAFETY_ANALYSIS GPUCKPT_THREAD_ATTRIBUTE(no_thread_safety_analysis)

#endif  // GPUCKPT_CORE_BASE_THREAD_ANNOTATIONS_H_
